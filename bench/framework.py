"""This app beside the stack's floor and lovia 0.9.119: the speed goals of issues 21 and 33.

Run from the repository root: ``python bench/framework.py`` (``--quick`` first;
``--only stream|stores`` for one half). lovia runs from a virtual environment of
its own (``python -m venv /tmp/lovia-venv && /tmp/lovia-venv/bin/pip install
'lovia[web]==0.9.119'``), so nothing in ours changes. The floor is the design
card's stack and nothing else (``--floor``, by default
/work/shared/bench/stack_floor_app.py: Starlette, sse-starlette and httpx relaying
the same stream); it runs beside the two servers in every streaming scenario but
the chat page, which it has none of. Every figure is process CPU (the server's,
from /proc; for the stores this process's or lovia's worker's, their threads
included) except the append's, which is fsync bound and taken as wall time.

Streaming: ``bench/stream.py``'s fake endpoint, scenarios and measures, imported.
Ours runs as ``python -m webapp``; lovia as its ``create_app(...)`` under its
``serve()``, with an agent like ours (our instructions, two small tools) and
three settings without which the rows would not compare: ``titles=False`` (a
title is one more model call per chat; ours asks none), ``max_background_runs=
256`` (its 8 refuses the 9th chat at once), a declared context window (else it
probes ``GET /models``). Each scenario runs both, in an order that rotates per
round; medians of ``--repeat`` rounds; every streamed text is checked whole.
Chats exist before the measured sends, for both: ours made by ``POST /chats``,
lovia's written through its store. So is the chat of 2,000 messages; lovia's
page is a script that fetches ``GET /api/sessions/{id}``: that JSON is its figure.

Stores, taking turns operation by operation at SQLite's default
``synchronous=FULL``: lovia's ``SQLiteSession`` in a worker process of its
interpreter, ours here with ``bench/stores.py``'s raw ``sqlite3`` floors (same
rows, text ready); the load's floor is a plain ``sqlite3`` read of the store's
own file with ``json.loads`` of every row, on a connection kept open. lovia's files get run 1 through its ``append`` and the rest
as the rows it writes (its ``entry_to_dict``), in one transaction: 10,000
appends would take it minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import stores as st  # bench/stores.py; it puts the repository root on sys.path
import stream as sb  # bench/stream.py
from stream_saves import FLOOR as FLOOR_APP  # the design card's stack and nothing else
from stream_saves import Floor

from webapp.stores.sqlite_session import SQLiteSession
from webapp.web.app import INSTRUCTIONS

Figures = dict[tuple[str, str], list[float]]  # (metric, app) -> samples

# --- lovia's side, run by its own interpreter --------------------------------------

_LOVIA_SERVER = """
import os, sys
from lovia import Agent, Compaction, tool
from lovia.providers import provider_from_string
from lovia.web import create_app, serve

port, db, base_url, uvicorn = sys.argv[1:5]

def calculator(expression: str) -> str: return expression
def current_time() -> str: return ""
tools = [tool(calculator, description="Evaluate an arithmetic expression."),
         tool(current_time, description="The current date and time.")]
model = provider_from_string("fake", api_key="bench", base_url=base_url)
agent = Agent(name="assistant", instructions=os.environ["BENCH_INSTRUCTIONS"], model=model,
              tools=tools)
app = create_app(agent, db_path=db, titles=False, followups=False, max_background_runs=256,
                 context_policy=Compaction(context_window=128_000))
extra = {"loop": "asyncio", "http": "h11"} if uvicorn == "plain" else {}
serve(app, host="127.0.0.1", port=int(port), log_level="warning", **extra)
"""

_LOVIA_STORES = """
import asyncio, json, shutil, sqlite3, sys, time
from pathlib import Path
from lovia.stores import SQLiteSession
from lovia.transcript import (AssistantTextEntry, InputEntry, ToolCallEntry, ToolResultEntry,
                              entry_to_dict)
from lovia.web import ChatStore

def run(n, chars=300):  # bench/stores.py's run_entries in lovia's entries
    return [InputEntry(role="user", content=f"question {n}: " + "w " * 20),
            ToolCallEntry(f"call-{n}", "lookup", json.dumps({"n": n})),
            ToolResultEntry(f"call-{n}", "r" * chars),
            AssistantTextEntry(f"answer {n}: " + "v " * 40)]

async def prefill(path, count, chars=300, wal=False):
    session = SQLiteSession(path, wal=wal)
    await session.append("s", run(0, chars), run_id="pre-0")
    rows = [("s", f"pre-{i}", json.dumps([entry_to_dict(e) for e in run(i, chars)],
             ensure_ascii=False), None, time.time()) for i in range(1, count)]
    conn = sqlite3.connect(path)
    conn.executemany("INSERT INTO session_runs (session_id, run_id, entries_json, meta_json, "
                     "created_at) VALUES (?, ?, ?, ?, ?)", rows)
    conn.commit(), conn.close()
    if len(await session.load("s")) != 4 * count:
        raise SystemExit(f"{path}: prefill did not store {count} runs")
    return session

async def timed(op, clock=time.process_time):  # process CPU, its threads included
    start = clock()
    result = await op()
    return clock() - start, result

async def main(folder):
    template, loads, appended, copies = folder / "lovia-trim.db", {}, 0, 0
    for line in sys.stdin:
        op, *args = json.loads(line)
        out = []
        store = ChatStore.sqlite(args[0]) if op in ("chats", "page") else None
        if op == "chats":  # new chats, as ours has them before its sends: no title yet
            for chat_id in args[1]:
                await store.upsert(chat_id, agent="assistant")
        elif op == "page":  # the chat bench/stream.py's build_pages writes for ours
            _, size, chat_id = args
            await store.upsert(chat_id, agent="assistant", title=f"{size} messages")
            reply = " ".join(["Here is a *reply* with `code` and some words."] * 6)
            for turn in range(size // 2):
                entries = [InputEntry(role="user", content=f"question {turn}: what about this?"),
                           AssistantTextEntry(content=f"{turn}. {reply}")]
                await store.session.append(chat_id, entries, run_id=f"{size:016x}{turn:016x}")
        elif op == "setup":
            await prefill(template, 1000, 4000)
            for n in (1000, 10000):
                loads[n] = await prefill(folder / f"lovia-load-{n}.db", n)
            appender = await prefill(folder / "lovia-append.db", 1000, wal=True)
        elif op == "trim":
            for _ in range(args[0]):
                copies += 1
                copy = folder / f"lovia-trim-{copies}.db"
                shutil.copyfile(template, copy)
                session = SQLiteSession(copy)
                await session.load("warm-up")
                took, trimmed = await timed(lambda: session.trim_tool_results("s", keep_chars=400))
                if trimmed != 999:
                    raise SystemExit(f"lovia trimmed {trimmed} results, not 999")
                out.append(took)
        elif op == "load":
            count, reps = args
            for _ in range(reps):
                took, entries = await timed(lambda: loads[count].load("s"))
                if len(entries) != 4 * count:
                    raise SystemExit(f"lovia loaded {len(entries)} entries, not {4 * count}")
                out.append(took)
        elif op == "append":
            for _ in range(args[0]):
                entries, rid = run(1000 + appended), f"new-{appended}"
                appended += 1
                op = lambda: appender.append("s", entries, run_id=rid)
                out.append((await timed(op, time.perf_counter))[0])  # fsync bound: wall
        print(json.dumps(out), flush=True)

asyncio.run(main(Path(sys.argv[1])))
"""


@dataclass
class Lovia(sb.App):
    """lovia's server, in place of ours: ``root`` is its working directory."""

    python: str = ""
    uvicorn: str = "installed"
    worker: Any = None  # a LoviaStores: writes chats through lovia's store

    def start(self, endpoint_port: int) -> None:
        self.port = sb.free_port()
        url = f"http://127.0.0.1:{endpoint_port}/v1"
        args = [str(self.port), str(self.db), url, self.uvicorn]
        env = {**os.environ, "BENCH_INSTRUCTIONS": INSTRUCTIONS}
        command = [self.python, "-c", _LOVIA_SERVER, *args]
        self.proc = subprocess.Popen(command, cwd=self.root, env=env, stdout=subprocess.DEVNULL)
        sb.wait_listening(self.port, self.proc, "lovia's server")

    async def build_page(self, size: int) -> None:
        self.pages = {size: f"{size:032x}"}
        await self.worker.run("page", str(self.db), size, self.pages[size])


# --- streaming ---------------------------------------------------------------------


async def lovia_once(http: httpx.AsyncClient, chat_id: str, ask: str) -> sb.Stream:
    """Send ``ask`` to a lovia chat and read the reply's stream to its ``done`` event."""
    out = sb.Stream(sent=time.monotonic())
    body = {"message": ask, "session_id": chat_id}
    parts: list[str] = []
    async with http.stream("POST", "/api/chat/stream", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"lovia answered {response.status_code}: {response.text[:300]}")
        event, data = "", []
        async for line in response.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif not line:
                if event == "text_delta":
                    if not parts:
                        out.first_text = time.monotonic()
                    parts.append(json.loads("\n".join(data))["delta"])
                elif event == "error":
                    raise RuntimeError(f"lovia's run failed: {' '.join(data)[:300]}")
                elif event == "done":
                    break
                event, data = "", []
    out.text = "".join(parts)
    return out


def check_whole(label: str, results: list[tuple[str, sb.Stream]], tokens: int) -> None:
    want = sb.expected_text(tokens)
    wrong = [(rid, len(stream.text)) for rid, stream in results if stream.text != want]
    if wrong:
        raise RuntimeError(
            f"{label}: {len(wrong)} of {len(results)} streams arrived wrong, e.g. {wrong[0][0]}: "
            f"{wrong[0][1]} characters for {len(want)}"
        )


class SideBySide(sb.Bench):
    """bench/stream.py's scenarios, for lovia through its JSON + SSE API."""

    async def timed(
        self, app: sb.App, name: str | None, chats: int, tokens: int, rate: float, rounds: int
    ) -> list[tuple[str, sb.Stream]]:
        if not isinstance(app, Lovia):
            return await super().timed(app, name, chats, tokens, rate, rounds)
        ids = [uuid.uuid4().hex for _ in range(chats * rounds)]
        await app.worker.run("chats", str(app.db), ids)  # outside the window, like ours
        limits = httpx.Limits(max_connections=4 * chats + 10, max_keepalive_connections=4 * chats)
        async with httpx.AsyncClient(base_url=app.base, timeout=120, limits=limits) as http:
            results: list[tuple[str, sb.Stream]] = []
            before = sb.cpu_seconds(app.pid)
            for r in range(rounds):
                asks = [self.ask(tokens, rate) for _ in range(chats)]
                batch = ids[r * chats : (r + 1) * chats]
                got = await asyncio.gather(
                    *(lovia_once(http, c, a) for c, (_, a) in zip(batch, asks, strict=True))
                )
                results += [(rid, s) for (rid, _), s in zip(asks, got, strict=True)]
            used = sb.cpu_seconds(app.pid) - before
        check_whole(app.label, results, tokens)
        if name is not None:
            kilotokens = len(results) * tokens / 1000
            self.add(app.label, f"{name}: CPU ms / 1k tokens", 1000 * used / kilotokens)
        return results

    async def page(self, app: sb.App, gets: int) -> None:
        if isinstance(app, Floor):
            return None  # the floor has no stored chats to show
        if not isinstance(app, Lovia):
            return await super().page(app, gets)
        async with httpx.AsyncClient(base_url=app.base, timeout=300) as http:
            for size, chat_id in app.pages.items():
                url = f"/api/sessions/{chat_id}"
                (await http.get(url)).raise_for_status()  # warm
                before = sb.cpu_seconds(app.pid)
                for _ in range(gets):
                    response = await http.get(url)
                    response.raise_for_status()
                used = sb.cpu_seconds(app.pid) - before
                if len(response.json()["entries"]) != size:
                    raise RuntimeError(f"lovia's chat of {size:,} messages came back short")
                self.add(app.label, f"page, {size:,} messages: CPU ms", 1000 * used / gets)
                self.add(app.label, f"page, {size:,} messages: KB", len(response.content) / 1000)


def run_stream(args: argparse.Namespace, folder: Path) -> Figures:
    sb.PAGE_SIZES = (2_000,)  # type: ignore[assignment]  # the goal's page, read when called
    names = ["latency", "latency100", "burst1", "burst50", "paced50", "page"]
    port = sb.free_port()
    endpoint = subprocess.Popen([sys.executable, str(BENCH / "stream.py"), "endpoint", str(port)])
    ours = sb.App("ours", sb.ROOT, folder / "ours.db")
    worker = LoviaStores(args.lovia_python, folder)
    lovia = Lovia("lovia", folder, folder / "lovia.db", python=args.lovia_python, worker=worker)
    lovia.uvicorn = args.lovia_uvicorn
    apps: list[sb.App] = [ours, lovia]
    if args.floor.exists():
        apps.append(Floor("floor", sb.ROOT, folder / "floor.db", script=args.floor))
    try:
        sb.wait_listening(port, endpoint, "the fake endpoint")
        ours.pages = sb.build_pages(ours.db, ours.root)
        asyncio.run(lovia.build_page(2_000))
        for app in apps:
            app.start(port)
        bench = SideBySide(f"http://127.0.0.1:{port}/v1")
        asyncio.run(sb.measure(bench, apps, names, args.repeat, args.quick))
    finally:
        for app in apps:
            if app.proc is not None:
                sb.stop(app.proc)
        sb.stop(endpoint)
        asyncio.run(worker.close())
    return bench.samples


# --- stores ------------------------------------------------------------------------


class OurStores:
    """Ours in this process, and the raw sqlite3 floors taking turns with it."""

    label = "ours"

    def __init__(self, folder: Path) -> None:
        self.folder, self.copies, self.appended = folder, 0, 0
        self.floors: Figures = {}
        self.opened: list[SQLiteSession] = []  # closed at the end

    async def run(self, op: str, *args: Any) -> list[float]:
        return await getattr(self, op)(*args)  # type: ignore[no-any-return]

    async def setup(self) -> list[float]:
        template = self.folder / "ours-trim.db"
        async with SQLiteSession(template) as session:
            await st.prefill(session, "s", 1_000, output_chars=4_000)
        self.rewrites = st._trimmed_rows(template)  # the floor's new text, ready
        self.loads = {n: SQLiteSession(self.folder / f"ours-load-{n}.db") for n in (1_000, 10_000)}
        self.appender = SQLiteSession(self.folder / "ours-append.db", wal=True)
        self.opened += [*self.loads.values(), self.appender]
        for n, session in self.loads.items():
            await st.prefill(session, "s", n)
        await st.prefill(self.appender, "s", 1_000)
        self.floor = await st.floor_connection(self.folder / "floor.db", wal=True)
        # the load's floor: plain sqlite3 on the store's own file, a connection kept open
        self.plain = {n: sqlite3.connect(self.folder / f"ours-load-{n}.db") for n in self.loads}
        for conn in self.plain.values():
            conn.execute(_PLAIN_READ, ("warm-up",)).fetchall()
        return []

    def copy(self) -> Path:
        self.copies += 1
        copy = self.folder / f"ours-trim-{self.copies}.db"
        shutil.copyfile(self.folder / "ours-trim.db", copy)
        return copy

    async def trim(self, copies: int) -> list[float]:
        out = []
        for _ in range(copies):
            async with SQLiteSession(self.copy()) as session:
                await session.load("warm-up")  # open the file outside the timing
                start = time.process_time()  # this process's CPU, the store's thread included
                trimmed = await session.trim_tool_results("s", keep_chars=400)
                out.append(time.process_time() - start)
            if trimmed != 999:
                raise RuntimeError(f"ours trimmed {trimmed} results, not 999")
            conn = sqlite3.connect(self.copy())  # synchronous=FULL, SQLite's default
            conn.execute("PRAGMA secure_delete = FAST")  # freed pages as the trim has them
            start = time.process_time()
            with conn:  # one transaction, committed
                conn.executemany(_REWRITE, self.rewrites)
            self.floors.setdefault((TRIM, "floor"), []).append(time.process_time() - start)
            conn.close()
        return out

    async def load(self, count: int, reps: int) -> list[float]:
        out = []
        floor = self.plain[count]
        for _ in range(reps):
            start = time.process_time()  # this process's CPU, the store's thread included
            entries = await self.loads[count].load("s")
            out.append(time.process_time() - start)
            if len(entries) != 4 * count:
                raise RuntimeError(f"ours loaded {len(entries)} entries, not {4 * count}")
            start = time.process_time()
            rows = [json.loads(data) for (data,) in floor.execute(_PLAIN_READ, ("s",))]
            took = time.process_time() - start
            self.floors.setdefault((f"load, {count:,} runs: ms", "floor"), []).append(took)
            if sum(map(len, rows)) != 4 * count:
                raise RuntimeError(f"the plain read found {sum(map(len, rows))} entries")
        return out

    async def append(self, count: int) -> list[float]:
        out = []
        for _ in range(count):
            i, self.appended = self.appended, self.appended + 1
            entries = st.run_entries(1_000 + i)
            start = time.perf_counter()
            await self.appender.append("s", entries, run_id=f"new-{i}")
            out.append(time.perf_counter() - start)
            row = ("s", 1_001 + i, f"new-{i}", 4 * (1_000 + i), 4, st.encoded(entries))
            start = time.perf_counter()
            self.floor.execute(st._FLOOR_INSERT, row)
            self.floors.setdefault((APPEND, "floor"), []).append(time.perf_counter() - start)
        return out

    async def close(self) -> None:
        for session in self.opened:
            await session.close()
        for conn in getattr(self, "plain", {}).values():
            conn.close()


class LoviaStores:
    """lovia's stores in a worker of its interpreter: JSON commands in, lists of seconds out."""

    label = "lovia"

    def __init__(self, python: str, folder: Path) -> None:
        command = [python, "-c", _LOVIA_STORES, str(folder)]
        self.proc = subprocess.Popen(command, stdin=PIPE, stdout=PIPE, text=True)

    async def run(self, *command: Any) -> list[float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"lovia's store worker exited with {self.proc.wait()}")
        return [float(x) for x in json.loads(line)]

    async def close(self) -> None:
        self.proc.communicate(timeout=30)  # closes its stdin: the worker's loop ends


TRIM, APPEND = "trim_tool_results, 1,000 runs: ms", "append, WAL, 1,000 runs stored: ms"
_REWRITE = "UPDATE session_segments SET entries_json = ? WHERE session_id = ? AND seq = ?"
_PLAIN_READ = "SELECT entries_json FROM session_segments WHERE session_id = ? ORDER BY seq"


async def run_stores(args: argparse.Namespace, folder: Path) -> Figures:
    """Operation by operation, ours and lovia's take turns, the first rotating per round."""
    q = args.quick
    ops: dict[str, tuple[Any, ...]] = {
        TRIM: ("trim", 1 if q else 2),
        "load, 1,000 runs: ms": ("load", 1_000, 3 if q else 7),
        "load, 10,000 runs: ms": ("load", 10_000, 1 if q else 3),
        APPEND: ("append", 30 if q else 60),
    }
    ours, lovia = OurStores(folder), LoviaStores(args.lovia_python, folder)
    samples: Figures = {}
    try:
        await ours.run("setup")
        await lovia.run("setup")
        for r in range(args.repeat):
            for metric, command in ops.items():
                for side in (ours, lovia) if r % 2 == 0 else (lovia, ours):
                    times = await side.run(*command)
                    samples.setdefault((metric, side.label), []).extend(times)
            print(f"stores: round {r + 1} of {args.repeat} done", file=sys.stderr)
    finally:
        await ours.close()
        await lovia.close()
    return {key: [1000 * t for t in times] for key, times in (samples | ours.floors).items()}


# (metric, reference, goal, limit): the goal wants ours / reference at most ``limit``;
# an empty goal: shown for reference only. "floor" is the design card's stack alone for
# the streaming rows, plain sqlite3 for the stores'.
RAW = " (vs raw sqlite3)"
BURST1, BURST50 = "burst, 1 chat: CPU ms / 1k tokens", "burst, 50 chats: CPU ms / 1k tokens"
PACED50 = "paced 25 tok/s, 50 chats: CPU ms / 1k tokens"
LOAD1, LOAD10 = "load, 1,000 runs: ms", "load, 10,000 runs: ms"
ROWS: list[tuple[str, str, str, float]] = [
    (BURST1, "floor", "<= 1.3x the floor", 1.3),
    ("burst, 1 chat: of it, off the loop's thread", "floor", "", 0.0),
    ("burst, 1 chat: context switches / reply", "floor", "", 0.0),
    (BURST50, "floor", "<= 1.3x the floor", 1.3),
    (PACED50, "floor", "<= 1.3x the floor", 1.3),
    ("paced 25 tok/s, 50 chats: of it, off the loop's thread", "floor", "", 0.0),
    ("paced 25 tok/s, 50 chats: context switches / reply", "floor", "", 0.0),
    ("first token added (p50 ms)", "lovia", "<= 0.5x lovia", 0.5),
    ("endpoint's token 1 -> client (p50 ms)", "lovia", "", 0.0),
    ("first token added, paced 100 tok/s (p50 ms)", "lovia", "<= 0.5x lovia", 0.5),
    ("endpoint's token 1 -> client, paced 100 tok/s (p50 ms)", "lovia", "", 0.0),
    ("page, 2,000 messages: CPU ms", "lovia", "<= 0.5x lovia", 0.5),
    ("page, 2,000 messages: KB", "lovia", "<= 0.5x lovia", 0.5),
    (TRIM, "lovia", ">= 2x faster", 1 / 2),
    (LOAD1, "floor", "<= 1.5x the floor", 1.5),
    (LOAD10, "floor", "<= 1.5x the floor", 1.5),
    (APPEND, "floor", "<= 1.5x the floor", 1.5),
]


def report(samples: Figures, args: argparse.Namespace) -> None:
    print(f"\nlovia's uvicorn: {args.lovia_uvicorn}; medians of {args.repeat} rounds")
    print("CPU: the server's process for streaming, this process (its threads included) or")
    print("lovia's worker for the stores; append is wall time (fsync bound)")
    width = max(len(r[0]) for r in ROWS) + 1
    header = f"{'row':<{width}}{'ours':>9}{'floor':>9}{'lovia':>9}{'ratio':>8}  {'goal':<19}met?"
    print(header + "\n" + "-" * len(header))
    for metric, reference, goal, limit in ROWS:
        got = {app: samples.get((metric, app)) for app in ("ours", "floor", "lovia")}
        cells = {app: statistics.median(v) if v else None for app, v in got.items()}
        a, b = cells["ours"], cells[reference]
        if a is None or b is None:
            continue
        ratio = a / b if b else float("inf")
        verdict = "-" if not goal else "yes" if ratio <= limit else "NO"
        shown = "".join(f"{c:>9,.1f}" if c is not None else f"{'-':>9}" for c in cells.values())
        tag = f"{ratio:>6.2f}x{'f' if reference == 'floor' else 'l'}" if b else f"{'-':>8}"
        print(f"{metric:<{width}}{shown}{tag}  {goal:<19}{verdict}")
    print("ratio = ours / the floor (xf) or / lovia (xl); noisy on a shared machine")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and rounds")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--only", choices=["stream", "stores"], help="one half of the bench")
    parser.add_argument("--lovia-python", default="/tmp/lovia-venv/bin/python", metavar="PATH")
    parser.add_argument("--floor", type=Path, default=FLOOR_APP, help="the stack's floor app")
    parser.add_argument(
        "--lovia-uvicorn", choices=["installed", "plain"], default="installed",
        help="installed: uvloop, httptools (lovia[web]'s); plain: asyncio, h11 (as ours)",
    )  # fmt: skip
    args = parser.parse_args()
    if not Path(args.lovia_python).exists():
        parser.error(f"no {args.lovia_python}: see this file's docstring, or pass --lovia-python")
    samples: Figures = {}
    with tempfile.TemporaryDirectory(prefix="bench-framework-") as tmp:
        if args.only in (None, "stream"):
            samples.update(run_stream(args, Path(tmp)))
        if args.only in (None, "stores"):
            samples.update(asyncio.run(run_stores(args, Path(tmp))))
    report(samples, args)


if __name__ == "__main__":
    main()
