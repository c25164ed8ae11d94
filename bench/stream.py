"""Streaming cost and latency of the chat server, end to end (issue 11).

Run from the repository root: ``python bench/stream.py`` (a few minutes).

A fake OpenAI-compatible endpoint on loopback (its own process, a raw asyncio
HTTP server) streams chat-completion chunks, one token each, as fast as it
can ("burst") or paced like a real model. The app runs as a real
``python -m webapp --base-url ... --model fake`` process; N chats send a
message at once and each reads its reply's SSE stream to the end, checking
that the text arrived whole. Measured:

- server CPU per 1,000 streamed tokens: utime+stime of the app process from
  ``/proc/<pid>/stat`` around the measured window (the send, the stream, the
  final bookkeeping; not the chats' creation). A reply's fixed cost (the
  send, the run's start, its final reply and saves) is measured on 1-token
  replies, and "streaming only" is the figure without it: what each token
  costs on its way from the endpoint's bytes to the browser's;
- added time to first token: the client's first ``text`` event after its
  send, minus the same wait on a request made directly to the endpoint (and,
  as a check, the first ``text`` event minus the moment the endpoint wrote its
  first token: both processes read the same monotonic clock);
- a chat page with 200 / 2,000 / 20,000 messages: server CPU and bytes per GET
  (those chats are written into the database before the server starts).

``--app LABEL=PATH`` (repeatable) runs the app from another checkout, e.g. a
copy of an older tree; every scenario then runs each app in turn, in a
rotating order, so the figures share the machine's conditions. Medians of
``--repeat`` rounds are printed. ``--profile SCENARIO`` records the first app
with py-spy (``pip install py-spy``) during one run of that scenario and
prints where its samples went.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
VOCABULARY = [f" w{i}" for i in range(97)] + [" a<b", " &amp;", ' "q"']
PAGE_SIZES = (200, 2_000, 20_000)

# --- the fake endpoint (run as ``python bench/stream.py endpoint PORT``) -------------

_CHUNK = (
    'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    '"model":"fake","system_fingerprint":"fp_bench","choices":[{"index":0,"delta":%s,'
    '"logprobs":null,"finish_reason":%s}]}\n\n'
)
_USAGE = (
    'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    '"model":"fake","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":%d,'
    '"total_tokens":%d}}\n\n'
)


def token(i: int) -> str:
    return VOCABULARY[i % len(VOCABULARY)]


def expected_text(tokens: int) -> str:
    return "".join(token(i) for i in range(tokens))


class Endpoint:
    """``POST /v1/chat/completions``: the last user message says ``id= tokens= rate=``."""

    def __init__(self) -> None:
        self.first_token: dict[str, float] = {}  # request id -> monotonic time of token 1

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                target = lines[0].split(" ")[1]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                if target.startswith("/stats"):
                    data = json.dumps(self.first_token).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(data), data)
                    )
                    await writer.drain()
                else:
                    await self.complete(json.loads(body), writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def complete(self, body: dict[str, object], writer: asyncio.StreamWriter) -> None:
        messages = body["messages"]
        assert isinstance(messages, list)
        ask = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        params = dict(part.split("=", 1) for part in ask.split() if "=" in part)
        request_id, tokens = params["id"], int(params["tokens"])
        pause = 1 / float(params["rate"]) if float(params.get("rate", 0)) > 0 else 0.0
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n"
        )

        def send(text: str) -> None:
            data = text.encode()
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))

        send(_CHUNK % ('{"role":"assistant","content":""}', "null"))
        for i in range(tokens):
            if i == 0:
                self.first_token[request_id] = time.monotonic()
            send(_CHUNK % (json.dumps({"content": token(i)}), "null"))
            await writer.drain()
            await asyncio.sleep(pause)  # burst: 0, one chunk per turn of the loop
        send(_CHUNK % ("{}", '"stop"'))
        send(_USAGE % (tokens, tokens + 10))
        send("data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def run_endpoint(port: int) -> None:
    endpoint = Endpoint()
    server = await asyncio.start_server(endpoint.serve, "127.0.0.1", port, backlog=512)
    async with server:
        await server.serve_forever()


# --- processes ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    return _stat_cpu(f"/proc/{pid}/stat")


def _stat_cpu(path: str) -> float:
    """utime + stime from a /proc ``stat`` file (a process's or one thread's)."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def thread_figures(pid: int) -> tuple[float, int]:
    """CPU seconds of the process's threads other than its first (the event loop's:
    the store's aiosqlite threads, Markdown's pool), and context switches of all."""
    off_loop, switches = 0.0, 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            cpu = _stat_cpu(f"/proc/{pid}/task/{task}/stat")
            with open(f"/proc/{pid}/task/{task}/status") as f:
                status = f.read()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        if task != str(pid):
            off_loop += cpu
        # voluntary (waits: for work, a lock, the GIL) and involuntary (preempted)
        switches += sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_sw" in line)
    return off_loop, switches


def wait_listening(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within 30 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class App:
    label: str
    root: Path
    db: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    pages: dict[int, str] = field(default_factory=dict)  # messages -> chat id

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, endpoint_port: int) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "webapp", "--port", str(self.port), "--db", str(self.db)]
        command += ["--base-url", f"http://127.0.0.1:{endpoint_port}/v1", "--model", "fake"]
        command += ["--log-level", "warning"]
        env = {**os.environ, "PYTHONPATH": str(self.root)}
        self.proc = subprocess.Popen(command, cwd=self.root, env=env, stdout=subprocess.DEVNULL)
        wait_listening(self.port, self.proc, f"the app {self.label}")


# --- the page chats, written before the server starts ---------------------------------


def build_pages(db: Path, root: Path) -> dict[int, str]:
    """One chat per size in PAGE_SIZES (half user messages, half replies), via direct SQL."""
    subprocess.run(
        [sys.executable, "-c", _CREATE_SCHEMA, str(db)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=True,
    )
    chats: dict[int, str] = {}
    now = time.time()
    reply = " ".join(["Here is a *reply* with `code` and some words."] * 6)
    with sqlite3.connect(db) as conn:
        for size in PAGE_SIZES:
            chat_id = f"{size:032x}"
            chats[size] = chat_id
            conn.execute(
                "INSERT INTO chats (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
                (chat_id, f"{size} messages", now, now),
            )
            parent = None
            for turn in range(size // 2):
                run_id = f"{size:016x}{turn:016x}"
                entries = [
                    {"type": "user", "text": f"question {turn}: what about this?"},
                    {"type": "assistant", "text": f"{turn}. {reply}"},
                ]
                conn.execute(
                    "INSERT INTO session_segments (session_id, seq, run_id, first_entry, "
                    "entry_count, entries_json, meta_json) VALUES (?, ?, ?, ?, 2, ?, NULL)",
                    (chat_id, turn + 1, run_id, 2 * turn, json.dumps(entries)),
                )
                conn.execute(
                    "INSERT INTO chat_runs (run_id, chat_id, parent_run_id, message_id, seq, "
                    "selected) VALUES (?, ?, ?, ?, ?, ?)",
                    (run_id, chat_id, parent, run_id, turn + 1, turn + 1),
                )
                parent = run_id
    return chats


_CREATE_SCHEMA = """
import asyncio, sys
from webapp.chats.users import EVERY_CHAT
from webapp.chats.store import ChatStore
async def main():
    async with ChatStore(sys.argv[1]) as store:
        await store.recent(EVERY_CHAT, 1)
asyncio.run(main())
"""


# --- the client ----------------------------------------------------------------------

_SSE_CONNECT = re.compile(r'sse-connect="([^"]+)"')
_TAG = re.compile(r"<[^>]*>")
_SOURCE = re.compile(r'<template class="reply-source">(.*?)</template>', re.DOTALL)
_CONTENT = re.compile(r'<div class="content streaming"[^>]*>(.*?)</div>', re.DOTALL)


@dataclass
class Stream:
    sent: float = 0.0  # monotonic, just before the message was posted
    first_text: float = 0.0  # the first text event arrived
    text: str = ""


async def chat_once(http: httpx.AsyncClient, chat_id: str, ask: str) -> Stream:
    """Send ``ask`` to the chat and read the reply's stream to its ``done`` event."""
    out = Stream(sent=time.monotonic())
    response = await http.post(
        f"/chats/{chat_id}/messages", data={"text": ask}, headers={"HX-Request": "true"}
    )
    found = _SSE_CONNECT.search(response.text)
    source = _SOURCE.search(response.text)
    if response.status_code == 200 and found is None and source is not None:
        # The run finished before the answer was drawn: it shows the final reply.
        out.first_text = time.monotonic()
        out.text = html.unescape(source.group(1))
        return out
    if response.status_code != 200 or found is None:
        raise RuntimeError(f"send answered {response.status_code}: {response.text[:300]}")
    # A run quick off the mark has text before the send's answer is drawn: the reply
    # element then carries it, and its stream goes on from there.
    shown = _CONTENT.search(response.text)
    parts = [html.unescape(_TAG.sub("", shown.group(1)))] if shown else []
    if parts and parts[0]:
        out.first_text = time.monotonic()
    else:
        parts = []
    event, data = "", []
    async with http.stream("GET", html.unescape(found.group(1))) as stream:
        async for line in stream.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif not line and event:
                if event == "text":
                    if not parts:
                        out.first_text = time.monotonic()
                    parts.append(html.unescape(_TAG.sub("", "\n".join(data))))
                elif event in ("done", "reset"):
                    break
                event, data = "", []
    out.text = "".join(parts)
    return out


async def direct_once(http: httpx.AsyncClient, url: str, ask: str) -> float:
    """Seconds from a request straight to the endpoint to its first token."""
    body = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": ask}]}
    start = time.monotonic()
    async with http.stream("POST", url, json=body) as response:
        lines = response.aiter_lines()
        async for line in lines:
            chunk = json.loads(line[5:]) if line.startswith("data: {") else {}
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                elapsed = time.monotonic() - start
                async for _ in lines:
                    pass
                return elapsed
    raise RuntimeError("the endpoint sent no token")


@dataclass
class Bench:
    endpoint: str
    sequence: int = 0
    samples: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    fixed: dict[str, float] = field(default_factory=dict)  # app -> CPU s of a 1-token reply

    def add(self, label: str, metric: str, value: float) -> None:
        self.samples.setdefault((metric, label), []).append(value)

    def ask(self, tokens: int, rate: float) -> tuple[str, str]:
        self.sequence += 1
        request_id = f"r{self.sequence}"
        return request_id, f"bench id={request_id} tokens={tokens} rate={rate:g}"

    async def first_tokens(self, http: httpx.AsyncClient) -> dict[str, float]:
        response = await http.get(self.endpoint.removesuffix("/v1") + "/stats")
        return dict(response.json())

    async def latency(self, app: App, rounds: int, tokens: int, rate: float = 0) -> None:
        """First token over the app and straight from the endpoint; ``rate`` 0 is a burst."""
        results = await self.timed(app, None, 1, tokens, rate, rounds)
        async with httpx.AsyncClient(timeout=60) as http:
            emitted = await self.first_tokens(http)
            direct = []
            for _ in range(rounds):
                _, ask = self.ask(tokens, rate)
                direct.append(await direct_once(http, self.endpoint + "/chat/completions", ask))
        ttft = [s.first_text - s.sent for _, s in results]
        lag = [s.first_text - emitted[rid] for rid, s in results]
        how = f", paced {rate:g} tok/s" if rate else ""
        self.add(app.label, f"first token, app{how} (p50 ms)", 1000 * statistics.median(ttft))
        self.add(app.label, f"first token, direct{how} (p50 ms)", 1000 * statistics.median(direct))
        self.add(
            app.label,
            f"first token added{how} (p50 ms)",
            1000 * (statistics.median(ttft) - statistics.median(direct)),
        )
        self.add(
            app.label, f"endpoint's token 1 -> client{how} (p50 ms)", 1000 * statistics.median(lag)
        )

    async def timed(
        self, app: App, name: str | None, chats: int, tokens: int, rate: float, rounds: int
    ) -> list[tuple[str, Stream]]:
        """``rounds`` times, ``chats`` chats send and stream at once; checks every text."""
        limits = httpx.Limits(max_connections=4 * chats + 10, max_keepalive_connections=4 * chats)
        async with httpx.AsyncClient(base_url=app.base, timeout=120, limits=limits) as http:
            ids = [
                (await http.post("/chats")).headers["location"].rsplit("/", 1)[1]
                for _ in range(chats * rounds)
            ]
            results: list[tuple[str, Stream]] = []
            before, threads_before = cpu_seconds(app.pid), thread_figures(app.pid)
            for r in range(rounds):
                asks = [self.ask(tokens, rate) for _ in range(chats)]
                batch = ids[r * chats : (r + 1) * chats]
                got = await asyncio.gather(
                    *(chat_once(http, c, a) for c, (_, a) in zip(batch, asks, strict=True))
                )
                results += [(rid, s) for (rid, _), s in zip(asks, got, strict=True)]
            used = cpu_seconds(app.pid) - before
            threads_after = thread_figures(app.pid)
        want = expected_text(tokens)
        wrong = [rid for rid, stream in results if stream.text != want]
        if wrong:
            text = dict(results)[wrong[0]].text
            at = next((i for i, (a, b) in enumerate(zip(text, want)) if a != b), len(text))
            raise RuntimeError(
                f"{app.label}: {len(wrong)} of {len(results)} streams arrived wrong, e.g. "
                f"{wrong[0]}: {len(text)} characters for {len(want)}, first difference at {at}: "
                f"{text[at - 20 : at + 20]!r} for {want[at - 20 : at + 20]!r}"
            )
        if name == "fixed":
            self.fixed[app.label] = used / len(results)
            self.add(app.label, "a reply's fixed cost: CPU ms", 1000 * used / len(results))
        elif name is not None:
            kilotokens = len(results) * tokens / 1000
            self.add(app.label, f"{name}: CPU ms / 1k tokens", 1000 * used / kilotokens)
            off_loop = threads_after[0] - threads_before[0]
            switches = threads_after[1] - threads_before[1]
            self.add(
                app.label, f"{name}: of it, off the loop's thread", 1000 * off_loop / kilotokens
            )
            self.add(app.label, f"{name}: context switches / reply", switches / len(results))
            if app.label in self.fixed:  # without the send, run start and final reply
                streaming = used - len(results) * self.fixed[app.label]
                self.add(app.label, f"{name}: streaming only", 1000 * streaming / kilotokens)
        return results

    async def page(self, app: App, gets: int) -> None:
        async with httpx.AsyncClient(base_url=app.base, timeout=300) as http:
            for size, chat_id in app.pages.items():
                await http.get(f"/chats/{chat_id}")  # warm: caches, first compile
                count = gets if size < 20_000 else 1  # one is seconds of CPU today
                before = cpu_seconds(app.pid)
                for _ in range(count):
                    response = await http.get(f"/chats/{chat_id}")
                    response.raise_for_status()
                used = cpu_seconds(app.pid) - before
                self.add(app.label, f"page, {size:,} messages: CPU ms", 1000 * used / count)
                self.add(app.label, f"page, {size:,} messages: KB", len(response.content) / 1000)


# --- the run -------------------------------------------------------------------------


def scenarios(quick: bool) -> dict[str, Callable[[Bench, App], object]]:
    tokens = 300 if quick else 1000
    return {
        "fixed": lambda b, a: b.timed(a, "fixed", 50, 1, 0, 1),
        "latency": lambda b, a: b.latency(a, 10 if quick else 20, tokens),
        # a model at a real pace: its first token does not come with 999 more at once
        "latency100": lambda b, a: b.latency(a, 10 if quick else 20, 20, 100),
        # 30 replies: /proc counts CPU in 10 ms ticks, and 10 replies of about 25 ms
        # each read to within 4% only, which is what separates 1.3x from 1.4x the floor
        "burst1": lambda b, a: b.timed(a, "burst, 1 chat", 1, tokens, 0, 10 if quick else 30),
        "burst50": lambda b, a: b.timed(a, "burst, 50 chats", 50, tokens, 0, 1),
        "paced50": lambda b, a: b.timed(
            a, "paced 25 tok/s, 50 chats", 50, 50 if quick else 200, 25, 1
        ),
        "page": lambda b, a: b.page(a, 2 if quick else 5),
    }


async def measure(bench: Bench, apps: list[App], names: list[str], repeat: int, quick: bool):
    table = scenarios(quick)
    for app in apps:  # warm up: imports, templates, the first connection
        await bench.timed(app, None, 1, 50, 0, 2)
    for r in range(repeat):
        for name in names:
            order = apps[r % len(apps) :] + apps[: r % len(apps)]
            for app in order:
                await table[name](bench, app)  # type: ignore[misc]
        print(f"round {r + 1} of {repeat} done", file=sys.stderr)


def start_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    command = [
        "py-spy",
        "record",
        "--pid",
        str(pid),
        "--rate",
        "500",
        "--format",
        "raw",
    ] + os.environ.get("SPY_ARGS", "").split()
    command += ["--nonblocking", "--output", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def profile(bench: Bench, app: App, name: str, quick: bool, out: Path) -> None:
    table = scenarios(quick)
    await bench.timed(app, None, 1, 50, 0, 2)
    spy = start_spy(app.pid, out)
    await asyncio.sleep(1)
    await table[name](bench, app)  # type: ignore[misc]
    spy.send_signal(signal.SIGINT)
    spy.wait(30)
    summarize_profile(out)


def summarize_profile(path: Path, top: int = 30) -> None:
    """Self and total samples per function, from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    files: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";") if f]
        if not frames or frames[-1].startswith("process "):
            continue
        n = int(count)
        samples += n
        own[frames[-1]] += n
        files[frames[-1].rsplit("(", 1)[-1].rstrip(")")] += n
        for frame in set(frames):
            total[frame] += n
    print(f"\n{samples} samples of the app's threads")
    print("\nself time by file:")
    for name, n in files.most_common(top):
        print(f"  {100 * n / samples:5.1f}%  {name}")
    print("\nself time by function:")
    for name, n in own.most_common(top):
        print(f"  {100 * n / samples:5.1f}%  {name}")
    print("\ntotal time by function:")
    for name, n in total.most_common(top + 20):
        print(f"  {100 * n / samples:5.1f}%  {name}")


def report(bench: Bench, labels: list[str]) -> None:
    metrics = list(dict.fromkeys(metric for metric, _ in bench.samples))
    width = max(len(m) for m in metrics) + 2
    print(f"\n{'median of the rounds':<{width}}" + "".join(f"{lab:>12}" for lab in labels))
    for metric in metrics:
        if metric.startswith("warm-up"):
            continue
        row = f"{metric:<{width}}"
        for label in labels:
            values = bench.samples.get((metric, label))
            row += f"{statistics.median(values):12.1f}" if values else f"{'-':>12}"
        print(row)


def main() -> None:
    if sys.argv[1:2] == ["endpoint"]:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run_endpoint(int(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app", action="append", default=[], metavar="LABEL=PATH")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated: " + ",".join(scenarios(False)))
    parser.add_argument("--quick", action="store_true", help="fewer tokens and rounds")
    parser.add_argument("--profile", default="", metavar="SCENARIO")
    parser.add_argument("--profile-out", default="/tmp/stream-profile.txt", metavar="FILE")
    args = parser.parse_args()
    names = [n for n in (args.only.split(",") if args.only else scenarios(False)) if n]
    specs = [s.split("=", 1) for s in args.app] or [["app", str(ROOT)]]
    with tempfile.TemporaryDirectory() as tmp:
        endpoint_port = free_port()
        endpoint = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "endpoint", str(endpoint_port)]
        )
        apps = [
            App(label, Path(path).resolve(), Path(tmp) / f"{label}.db") for label, path in specs
        ]
        try:
            wait_listening(endpoint_port, endpoint, "the fake endpoint")
            template = Path(tmp) / "pages.db"
            pages = build_pages(template, apps[0].root) if "page" in names else {}
            for app in apps:
                if pages:
                    shutil.copy(template, app.db)
                app.pages = pages
                app.start(endpoint_port)
            bench = Bench(f"http://127.0.0.1:{endpoint_port}/v1")
            if args.profile:
                out = Path(args.profile_out)
                asyncio.run(profile(bench, apps[0], args.profile, args.quick, out))
            else:
                asyncio.run(measure(bench, apps, names, args.repeat, args.quick))
                report(bench, [app.label for app in apps])
        finally:
            for app in apps:
                if app.proc is not None:
                    stop(app.proc)
            stop(endpoint)


if __name__ == "__main__":
    main()
