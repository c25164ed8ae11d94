"""Tools that ask first (SPEC §11): what a waiting run costs, and how soon Allow runs the tool.

Run from the repository root: ``python bench/approvals.py`` (about 40 s; ``--runs``,
``--seconds``, ``--allows``). The app runs as ``python -m webapp`` with the browser
tests' fake endpoint in its "tools" mode (a message names the tool the model calls) and
tests/mcp_server.py as its one MCP server over stdio. Printed, never asserted:

1. CPU while runs wait: the app process's CPU time (utime + stime) over ``--seconds``
   with no run at all, then with ``--runs`` runs waiting for a decision on
   ``write_note``. A paused run holds no task, so the two should match (the MCP
   server's ping every 10 s is in both).
2. Allow to the tool's start: for ``--allows`` of the waiting runs in turn, the time
   from sending the Allow form to the line ``write_note`` appends to notes.txt (polled
   every 0.5 ms), and to the answer of the POST; p50, p95 and max.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "web"))
sys.path.insert(0, str(ROOT))

from browser.harness import MCP_SERVER, AppServer, FakeEndpoint, free_port

_FORM = re.compile(
    r'<form method="post" action="([^"]+/decide)"[^>]*>\s*'
    r'<input type="hidden" name="call_id" value="([^"]+)">\s*'
    r'<input type="hidden" name="decision" value="allow">'
)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # clock ticks; USER_HZ is 100


def cpu_over(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return cpu_seconds(pid) - before


def start(directory: Path, endpoint: FakeEndpoint) -> AppServer:
    config = directory / "webapp.toml"
    args = json.dumps([str(MCP_SERVER), str(directory)])
    config.write_text(
        f"[mcp_servers.test]\ncommand = {json.dumps(sys.executable)}\nargs = {args}\n"
    )
    server = AppServer(
        port=free_port(),
        db=directory / "chat.db",
        log_path=directory / "server.log",
        extra_args=["--base-url", endpoint.base_url, "--model", "b", "--config", str(config)],
    )
    server.start()
    return server


def pause_runs(http: httpx.Client, count: int) -> list[str]:
    """``count`` chats whose run waits for Allow on write_note; their ids."""
    chats = []
    for i in range(count):
        chat_id = http.post("/chats").headers["location"].rsplit("/", 1)[1]
        text = f'call test__write_note {{"text": "bench-{i}"}}'
        http.post(f"/chats/{chat_id}/messages", data={"text": text})
        chats.append(chat_id)
    deadline = time.monotonic() + 60
    for chat_id in chats:
        while 'data-status="waiting"' not in http.get(f"/chats/{chat_id}").text:
            if time.monotonic() > deadline:
                raise RuntimeError(f"chat {chat_id} never waited for approval")
            time.sleep(0.05)
    return chats


def allow_once(http: httpx.Client, chat_id: str, notes: Path, line: str) -> tuple[float, float]:
    """(seconds to the POST's answer, seconds to the tool's line in notes.txt)."""
    found = _FORM.search(http.get(f"/chats/{chat_id}").text)
    if found is None:
        raise RuntimeError(f"chat {chat_id} shows no Allow form")
    action, call_id = found.group(1), found.group(2)
    started = time.perf_counter()
    answered = http.post(action, data={"call_id": call_id, "decision": "allow"})
    answered_at = time.perf_counter() - started
    if answered.status_code != 303:
        raise RuntimeError(f"Allow answered {answered.status_code}: {answered.text[:200]}")
    while line not in (notes.read_text() if notes.exists() else ""):
        if time.perf_counter() - started > 30:
            raise RuntimeError(f"write_note never ran for {line!r}")
        time.sleep(0.0005)
    return answered_at, time.perf_counter() - started


def spread(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return f"p50 {statistics.median(ms):.1f} ms, p95 {p95:.1f} ms, max {ms[-1]:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="runs left waiting (default 50)")
    parser.add_argument("--seconds", type=float, default=10.0, help="CPU window (default 10)")
    parser.add_argument("--allows", type=int, default=20, help="Allows timed (default 20)")
    args = parser.parse_args()
    endpoint = FakeEndpoint(mode="tools")
    endpoint.start()
    with tempfile.TemporaryDirectory(prefix="bench-approvals-") as folder:
        directory = Path(folder)
        server = start(directory, endpoint)
        try:
            assert server.proc is not None
            pid = server.proc.pid
            with httpx.Client(base_url=server.base_url, timeout=30) as http:
                time.sleep(2)  # start-up settles (imports, the MCP server's first ping)
                idle = cpu_over(pid, args.seconds)
                chats = pause_runs(http, args.runs)
                time.sleep(1)
                waiting = cpu_over(pid, args.seconds)
                timings = [
                    allow_once(http, chat_id, directory / "notes.txt", f"bench-{i}")
                    for i, chat_id in enumerate(chats[: args.allows])
                ]
        finally:
            server.stop()
            endpoint.stop()
    print(f"CPU of the app process over {args.seconds:g} s (SQLite, one process):")
    print(f"  no runs:                  {idle:.2f} s ({idle / args.seconds:.1%} of a core)")
    print(f"  {args.runs} runs waiting:          {waiting:.2f} s ({waiting / args.seconds:.1%})")
    print(f"Allow to the tool's start, {len(timings)} runs in turn:")
    print(f"  the POST's answer (303):  {spread([t[0] for t in timings])}")
    print(f"  write_note's line written: {spread([t[1] for t in timings])}")


if __name__ == "__main__":
    main()
