"""Store benchmarks: does each operation cost what it changes, not the history's length?

Run from the repository root: ``python bench/stores.py`` (about a minute).
Every figure uses real files in a temporary directory with the stores'
default ``synchronous=FULL``, so an append's time includes its fsync.
Per-operation figures are medians; the table's last column states each target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from webapp.stores.checkpoint import RunHead
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.stores.sqlite_session import SQLiteSession
from webapp.transcript import (
    AssistantEntry,
    Entry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
)

Row = tuple[str, str, str]


def run_entries(n: int, output_chars: int = 300) -> list[Entry]:
    """One typical run: a question, a tool call and its result, an answer."""
    return [
        UserEntry(f"question {n}: " + "w " * 20),
        ToolCallEntry(f"call-{n}", "lookup", json.dumps({"n": n})),
        ToolResultEntry(f"call-{n}", "r" * output_chars),
        AssistantEntry(f"answer {n}: " + "v " * 40),
    ]


async def median_of(count: int, op: Callable[[int], Awaitable[object]]) -> float:
    """Median seconds of ``count`` sequential calls ``op(i)``."""
    times = []
    for i in range(count):
        start = time.perf_counter()
        await op(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def prefill(session: SQLiteSession, sid: str, count: int, output_chars: int = 300) -> None:
    """``count`` segments, written concurrently so group commit makes this quick."""
    for base in range(0, count, 500):
        await asyncio.gather(
            *(
                session.append(sid, run_entries(i, output_chars), run_id=f"pre-{i}")
                for i in range(base, min(base + 500, count))
            )
        )


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


async def bench_append(folder: Path) -> list[Row]:
    rows: list[Row] = []
    sizes = (10, 1_000, 10_000)
    for wal in (True, False):
        mode = "WAL" if wal else "rollback"
        stores = {n: SQLiteSession(folder / f"append-{n}-{mode}.db", wal=wal) for n in sizes}
        for n, session in stores.items():
            await prefill(session, "s", n)
        # Round-robin over the three sizes so disk noise hits them alike.
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for i in range(150):
            for n, session in stores.items():
                begin = time.perf_counter()
                await session.append("s", run_entries(i), run_id=f"new-{i}")
                times[n].append(time.perf_counter() - begin)
        for session in stores.values():
            await session.close()
        figures = {n: statistics.median(t) for n, t in times.items()}
        for n in sizes:
            rows.append((f"session append ({mode}), {n:,} prior segments", ms(figures[n]), ""))
        ratio = figures[10_000] / figures[10]
        verdict = "ok" if ratio <= 1.5 else "NOT FLAT"
        rows.append(("  append 10,000 / append 10", f"{ratio:.2f}x", f"<= 1.5x: {verdict}"))
    return rows


async def bench_load_rewind_trim(folder: Path) -> list[Row]:
    rows = []
    for count in (1_000, 10_000):
        async with SQLiteSession(folder / f"load-{count}.db") as session:
            await prefill(session, "s", count)
            took = await median_of(5, lambda _: session.load("s"))
            rows.append((f"session load, {count:,} segments", ms(took), ""))
    async with SQLiteSession(folder / "rewind.db") as session:
        await prefill(session, "s", 1_000)
        total = len(await session.load("s"))
        times = []
        for _ in range(20):
            begin = time.perf_counter()
            removed = await session.rewind("s", keep_entries=total - 2)  # inside the last run
            times.append(time.perf_counter() - begin)
            assert removed == 3, removed  # the answer, the result and its dangling call
            # Put the last run back whole for the next round (not timed).
            await session.rewind("s", keep_entries=total - 4)
            await session.append("s", run_entries(999), run_id="pre-999")
        rows.append(
            ("session rewind near the end, 1,000 segments", ms(statistics.median(times)), "")
        )
    async with SQLiteSession(folder / "trim.db") as session:
        await prefill(session, "s", 1_000, output_chars=4_000)
        start = time.perf_counter()
        trimmed = await session.trim_tool_results("s", keep_chars=400)
        first = time.perf_counter() - start
        start = time.perf_counter()
        again = await session.trim_tool_results("s", keep_chars=400)
        second = time.perf_counter() - start
        rows.append((f"trim_tool_results, 1,000 segments ({trimmed} trimmed)", ms(first), ""))
        rows.append((f"  trim again, idempotent ({again} trimmed)", ms(second), ""))
    return rows


async def bench_checkpoint(folder: Path) -> list[Row]:
    rows: list[Row] = []
    sizes = (10, 1_000)
    for wal in (True, False):
        mode = "WAL" if wal else "rollback"
        stores = {n: SQLiteCheckpointer(folder / f"cp-{n}-{mode}.db", wal=wal) for n in sizes}
        for n, cp in stores.items():
            for i in range(n):
                await cp.append("run", [AssistantEntry(f"turn {i} " + "t " * 50)], RunHead("main"))
        # Round-robin over the two sizes so disk noise hits them alike.
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for i in range(150):
            for n, cp in stores.items():
                begin = time.perf_counter()
                await cp.append("run", [AssistantEntry(f"more {i}")], RunHead("main", turns=i))
                times[n].append(time.perf_counter() - begin)
        for n, cp in stores.items():
            snapshot = await cp.load("run")
            assert snapshot is not None and len(snapshot.entries) == n + 150
            await cp.close()
        figures = {n: statistics.median(t) for n, t in times.items()}
        for n in sizes:
            rows.append((f"checkpoint append ({mode}), {n:,} prior saves", ms(figures[n]), ""))
        ratio = figures[1_000] / figures[10]
        rows.append(("  append 1,000 / append 10", f"{ratio:.2f}x", "flat: cost = what it adds"))
    return rows


async def bench_concurrency(folder: Path) -> list[Row]:
    rows = []
    for wal in (False, True):
        async with SQLiteSession(folder / f"concurrent-{wal}.db", wal=wal) as session:
            await session.load("warm-up")

            async def task(t: int) -> None:
                for i in range(40):
                    await session.append(f"chat-{t % 10}", run_entries(i), run_id=f"{t}-{i}")

            start = time.perf_counter()
            await asyncio.gather(*(task(t) for t in range(50)))
            rate = 2_000 / (time.perf_counter() - start)
            stored = sum([len(await session.segments(f"chat-{c}")) for c in range(10)])
            ok = "ok" if rate >= 2_000 and stored == 2_000 else "BELOW TARGET"
            mode = "WAL" if wal else "rollback journal"
            rows.append(
                (
                    f"50 tasks x 40 appends, one store ({mode})",
                    f"{rate:,.0f} appends/s",
                    f">= 2,000/s: {ok}",
                )
            )
    return rows


def bench_processes(folder: Path) -> list[Row]:
    db = folder / "processes.db"
    go = folder / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", str(db), f"p{n}", "500", str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    time.sleep(1.0)  # let all four import and open the file, then start together
    go.touch()
    start = time.perf_counter()
    reports = [json.loads(p.communicate(timeout=90)[0]) for p in procs]
    took = time.perf_counter() - start
    errors = sum(r["lock_errors"] + r["other_errors"] for r in reports)
    stored = _count_segments(db)
    ok = "ok" if errors == 0 and stored == 2_000 else "FAILED"
    return [
        ("4 processes x 500 appends, one WAL file", f"{2_000 / took:,.0f} appends/s", ""),
        ("  lock errors / segments stored", f"{errors} / {stored:,}", f"0 / 2,000: {ok}"),
    ]


def _count_segments(db: Path) -> int:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM session_segments").fetchone()[0])


async def child(db: str, name: str, count: int, go: str) -> None:
    lock_errors = other_errors = 0
    async with SQLiteSession(db, wal=True) as session:
        await session.load("shared")
        deadline = time.monotonic() + 30
        while not os.path.exists(go) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        for i in range(count):
            try:
                await session.append("shared", run_entries(i), run_id=f"{name}-{i}")
            except Exception as exc:  # noqa: BLE001 -- counted and reported, that is the point
                if "locked" in str(exc):
                    lock_errors += 1
                else:
                    other_errors += 1
    print(json.dumps({"lock_errors": lock_errors, "other_errors": other_errors}))


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-stores-") as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        rows: list[Row] = []
        rows += await bench_append(folder)
        rows += await bench_load_rewind_trim(folder)
        rows += await bench_checkpoint(folder)
        rows += await bench_concurrency(folder)
        rows += bench_processes(folder)
        width = max(len(r[0]) for r in rows)
        print(f"{'operation':<{width}}  {'result':>18}  target")
        print("-" * (width + 40))
        for name, value, target in rows:
            print(f"{name:<{width}}  {value:>18}  {target}")
        print(f"\n(total {time.perf_counter() - started:.1f} s, Python {sys.version.split()[0]})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=4, metavar=("DB", "NAME", "COUNT", "GO"))
    args = parser.parse_args()
    if args.child:
        db, name, count, go = args.child
        asyncio.run(child(db, name, int(count), go))
    else:
        asyncio.run(main())
