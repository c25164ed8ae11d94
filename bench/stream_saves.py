"""What saving a reply's streamed text costs while it streams (issue 35), beside issue 31's floor.

Run from the repository root: ``python bench/stream_saves.py`` (a few minutes;
``--quick`` first). bench/stream.py's fake endpoint, client and scenarios, for
three servers on one machine, in a rotating order per round:

- ``saves``: the app as it is: a streaming reply's text is saved beside its
  checkpoint at most 200 ms after it arrives (webapp.runtime.streaming);
- ``no saves``: the same app with those saves switched off (the turn in flight
  is then redone after a crash, as before issue 35);
- ``floor``: the design card's stack and nothing else (Starlette, sse-starlette
  and httpx relaying the stream: /work/shared/bench/stack_floor_app.py, or
  ``--floor PATH``), issue 31's floor.

Server CPU per 1,000 streamed tokens (``/proc`` utime+stime around the
window), medians of ``--repeat`` rounds; every streamed text is checked whole.
"saves" minus "no saves" is what the saves cost. The scenarios: 50 chats at a
model's pace (25 tokens/s each: saves are what they are at that pace, one per
200 ms per reply); one chat bursting 1,000 tokens; one chat of a 10,000-token
reply at 500 tokens/s (20 s: 100 saves, each adding only its new text, never
the reply so far). And the time to first token added over a direct request, at
100 tokens/s: a reply's first save is written with its first token.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import stream as sb  # bench/stream.py

FLOOR = Path("/work/shared/bench/stack_floor_app.py")

_NO_SAVES = """
import sys
from webapp.runtime import streaming

streaming.turn_saves = lambda *args, **kwargs: streaming.NO_SAVES
from webapp.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class NoSaves(sb.App):
    """The app with the streamed-text saves switched off."""

    def start(self, endpoint_port: int) -> None:
        self.port = sb.free_port()
        command = [sys.executable, "-c", _NO_SAVES, "--port", str(self.port)]
        command += ["--db", str(self.db), "--log-level", "warning"]
        command += ["--base-url", f"http://127.0.0.1:{endpoint_port}/v1", "--model", "fake"]
        env = {**os.environ, "PYTHONPATH": str(self.root)}
        self.proc = subprocess.Popen(  # quiet: its ^C traceback at the end is noise
            command, cwd=self.root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        sb.wait_listening(self.port, self.proc, f"the app {self.label}")


@dataclass
class Floor(sb.App):
    """The stack's floor: no database, no runtime, no saves."""

    script: Path = FLOOR

    def start(self, endpoint_port: int) -> None:
        self.port = sb.free_port()
        upstream = f"http://127.0.0.1:{endpoint_port}/v1"
        command = [sys.executable, str(self.script), str(self.port), upstream]
        self.proc = subprocess.Popen(
            command, cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        sb.wait_listening(self.port, self.proc, "the floor app")


def scenarios(quick: bool) -> dict[str, object]:
    return {
        "fixed": lambda b, a: b.timed(a, "fixed", 20 if quick else 50, 1, 0, 1),
        # the first save goes out with the first token: it must not delay it
        "latency100": lambda b, a: b.latency(a, 10 if quick else 20, 20, 100),
        "paced50": lambda b, a: b.timed(
            a, "paced 25 tok/s, 50 chats", 50, 50 if quick else 150, 25, 1
        ),
        "burst1": lambda b, a: b.timed(a, "burst, 1 chat", 1, 1000, 0, 3 if quick else 5),
        "long": lambda b, a: b.timed(
            a, "10,000 tokens at 500 tok/s", 1, 2_000 if quick else 10_000, 500, 1
        ),
    }


async def measure(bench: sb.Bench, apps: list[sb.App], repeat: int, quick: bool) -> None:
    table = scenarios(quick)
    for app in apps:  # warm up: imports, templates, the first connection
        await bench.timed(app, None, 1, 50, 0, 2)
    for r in range(repeat):
        for run in table.values():
            for app in apps[r % len(apps) :] + apps[: r % len(apps)]:
                await run(bench, app)  # type: ignore[operator]
        print(f"round {r + 1} of {repeat} done", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer tokens and rounds")
    parser.add_argument("--floor", type=Path, default=FLOOR, help="the stack floor app")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = sb.free_port()
        endpoint = subprocess.Popen(
            [sys.executable, str(BENCH / "stream.py"), "endpoint", str(port)]
        )
        apps: list[sb.App] = [
            sb.App("saves", sb.ROOT, Path(tmp) / "saves.db"),
            NoSaves("no saves", sb.ROOT, Path(tmp) / "no-saves.db"),
        ]
        if args.floor.exists():
            apps.append(Floor("floor", sb.ROOT, Path(tmp) / "floor.db", script=args.floor))
        try:
            sb.wait_listening(port, endpoint, "the fake endpoint")
            for app in apps:
                app.start(port)
            bench = sb.Bench(f"http://127.0.0.1:{port}/v1")
            asyncio.run(measure(bench, apps, args.repeat, args.quick))
            sb.report(bench, [app.label for app in apps])
        finally:
            for app in apps:
                if app.proc is not None:
                    sb.stop(app.proc)
            sb.stop(endpoint)


if __name__ == "__main__":
    main()
