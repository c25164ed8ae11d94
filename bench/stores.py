"""Store benchmarks: does each operation cost what it changes, not the history's length?

Run from the repository root: ``python bench/stores.py`` (about a minute;
``--only load,trim`` runs some sections). Every figure uses real files in a
temporary directory with the stores' default ``synchronous=FULL``, so an
append's time includes its fsync. Per-operation figures are medians; the
table's last column states each target.

Two kinds of yardstick are measured in the same run as the figure they judge,
taking turns with it so that a noisy machine hits both alike:
- a floor: what raw ``sqlite3`` needs for the same disk work (one persistent
  connection, no asyncio, payload encoded beforehand);
- "before": the implementation this one replaced (issue 11), kept below as
  code so that its figure comes from this machine, not from a note.
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from webapp.stores.checkpoint import RunHead
from webapp.stores.session import Segment, trim_entries
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.stores.sqlite_session import SQLiteSession
from webapp.transcript import (
    AssistantEntry,
    Entry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
    entry_from_dict,
    entry_to_dict,
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


async def interleaved(
    repeats: int, ops: dict[str, Callable[[], Awaitable[object]]]
) -> dict[str, float]:
    """Median seconds of each op, the ops taking turns so that noise hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(repeats):
        for name, op in ops.items():
            start = time.perf_counter()
            await op()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def faster(now: float, before: float, goal: float) -> str:
    ratio = before / now
    verdict = "ok" if ratio >= goal else "BELOW GOAL"
    return f"before {ms(before)}: {ratio:.2f}x faster, goal >= {goal:g}x: {verdict}"


def encoded(entries: list[Entry]) -> str:
    """A run's ``entries_json`` exactly as the session store writes it."""
    return json.dumps([entry_to_dict(e) for e in entries], ensure_ascii=False)


# --- the implementation before issue 11, the yardstick for load and trim ----------

_ROWS = "SELECT seq, run_id, entries_json{} FROM session_segments WHERE session_id = ? ORDER BY seq"


async def load_before(db: aiosqlite.Connection, sid: str) -> list[Entry]:
    out: list[Entry] = []
    for _, _, data in await db.execute_fetchall(_ROWS.format(""), (sid,)):
        out.extend([entry_from_dict(item) for item in json.loads(data)])
    return out


async def segments_before(db: aiosqlite.Connection, sid: str) -> list[Segment]:
    rows = await db.execute_fetchall(_ROWS.format(", meta_json"), (sid,))
    return [
        Segment(run_id, [entry_from_dict(item) for item in json.loads(data)], _meta(meta))
        for _, run_id, data, meta in rows
    ]


def _meta(meta_json: str | None) -> Any:
    return None if meta_json is None else json.loads(meta_json)


async def trim_before(db: aiosqlite.Connection, sid: str, keep_chars: int = 400) -> int:
    """Decode every older run, trim in Python, re-encode the changed ones (keep_runs=1)."""
    await db.execute("BEGIN IMMEDIATE")
    rows = list(await db.execute_fetchall(_ROWS.format(""), (sid,)))
    updates, total = [], 0
    for seq, _, data in rows[:-1]:
        entries, count = trim_entries([entry_from_dict(i) for i in json.loads(data)], keep_chars)
        if count:
            updates.append((encoded(entries), sid, seq))
            total += count
    await db.executemany(
        "UPDATE session_segments SET entries_json = ? WHERE session_id = ? AND seq = ?", updates
    )
    await db.execute("COMMIT")
    return total


async def bench_append(folder: Path) -> list[Row]:
    rows: list[Row] = []
    sizes = (10, 1_000, 10_000)
    runs = [run_entries(i) for i in range(150)]
    for wal in (True, False):
        mode = "WAL" if wal else "rollback"
        stores = {n: SQLiteSession(folder / f"append-{n}-{mode}.db", wal=wal) for n in sizes}
        for n, session in stores.items():
            await prefill(session, "s", n)
        floor = await floor_connection(folder / f"floor-{mode}.db", wal)
        # Round-robin over the three sizes and the floor so disk noise hits them alike.
        times: dict[int, list[float]] = {n: [] for n in (*sizes, 0)}
        for i, entries in enumerate(runs):
            for n, session in stores.items():
                begin = time.perf_counter()
                await session.append("s", entries, run_id=f"new-{i}")
                times[n].append(time.perf_counter() - begin)
            row = ("s", 1_001 + i, f"new-{i}", 4 * (1_000 + i), 4, encoded(entries))
            begin = time.perf_counter()
            floor.execute(_FLOOR_INSERT, row)
            times[0].append(time.perf_counter() - begin)
        for session in stores.values():
            await session.close()
        floor.close()
        figures = {n: statistics.median(t) for n, t in times.items()}
        for n in sizes:
            rows.append((f"session append ({mode}), {n:,} prior segments", ms(figures[n]), ""))
        ratio = figures[10_000] / figures[10]
        verdict = "ok" if ratio <= 1.5 else "NOT FLAT"
        rows.append(("  append 10,000 / append 10", f"{ratio:.2f}x", f"<= 1.5x: {verdict}"))
        rows.append(
            (f"  floor: raw sqlite3 insert ({mode}, FULL), 1,000 prior", ms(figures[0]), "")
        )
        ratio = figures[1_000] / figures[0]
        goal = "<= 1.5x: " + ("ok" if ratio <= 1.5 else "ABOVE GOAL") if wal else "(no goal)"
        rows.append(("  append 1,000 / floor", f"{ratio:.2f}x", goal))
        # Steadier than the ratio, which moves with what an fsync costs: that depends
        # on what else the disk was given since the last one.
        own = (figures[1_000] - figures[0]) * 1e6
        rows.append(("  append 1,000 - floor: the store's own share", f"{own:.0f} us", ""))
    return rows


_FLOOR_INSERT = (
    "INSERT INTO session_segments (session_id, seq, run_id, first_entry, entry_count, "
    "entries_json, meta_json) VALUES (?, ?, ?, ?, ?, ?, NULL)"
)


async def floor_connection(path: Path, wal: bool) -> sqlite3.Connection:
    """A plain connection to a file holding 1,000 runs, set up as the store sets its own."""
    async with SQLiteSession(path, wal=wal) as session:
        await prefill(session, "s", 1_000)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = FULL")
    return conn


async def bench_load(folder: Path) -> list[Row]:
    rows: list[Row] = []
    for count, repeats in ((1_000, 21), (10_000, 9)):
        path = folder / f"load-{count}.db"
        async with SQLiteSession(path) as session:
            await prefill(session, "s", count)
        async with SQLiteSession(path) as session, aiosqlite.connect(path) as before:
            assert await session.load("s") == await load_before(before, "s")
            assert await session.segments("s") == await segments_before(before, "s")
            figures = await interleaved(
                repeats,
                {
                    "load": lambda: session.load("s"),
                    "load before": lambda: load_before(before, "s"),
                    "segments": lambda: session.segments("s"),
                    "segments before": lambda: segments_before(before, "s"),
                },
            )
        for what in ("load", "segments"):
            now, then = figures[what], figures[f"{what} before"]
            rows.append((f"session {what}, {count:,} segments", ms(now), faster(now, then, 1.5)))
    return rows


async def bench_rewind(folder: Path) -> list[Row]:
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
        return [("session rewind near the end, 1,000 segments", ms(statistics.median(times)), "")]


async def bench_trim(folder: Path) -> list[Row]:
    """The first trim of 1,000 runs with long outputs (999 to shorten), then a second one.

    Each round trims a fresh copy of one file, once per implementation. The
    floor is the disk's share: the same 999 rows rewritten, their new text
    computed beforehand, in one committed transaction (freed pages not zeroed,
    as the trim has them).
    """
    template = folder / "trim.db"
    async with SQLiteSession(template) as session:
        await prefill(session, "s", 1_000, output_chars=4_000)
    rewrites = _trimmed_rows(template)
    times: dict[str, list[float]] = {}

    def record(name: str, start: float) -> None:
        times.setdefault(name, []).append(time.perf_counter() - start)

    for round_ in range(5):
        copies = {k: folder / f"trim-{k}-{round_}.db" for k in ("now", "before", "floor")}
        for copy in copies.values():
            shutil.copyfile(template, copy)
        async with SQLiteSession(copies["now"]) as session:
            await session.load("warm-up")  # open the file outside the timing
            start = time.perf_counter()
            assert await session.trim_tool_results("s", keep_chars=400) == 999
            record("first", start)
            start = time.perf_counter()
            assert await session.trim_tool_results("s", keep_chars=400) == 0
            record("again", start)
        async with aiosqlite.connect(copies["before"], isolation_level=None) as db:
            await db.execute("PRAGMA synchronous = FULL")
            start = time.perf_counter()
            assert await trim_before(db, "s") == 999
            record("first before", start)
            start = time.perf_counter()
            assert await trim_before(db, "s") == 0
            record("again before", start)
        conn = sqlite3.connect(copies["floor"], isolation_level=None)
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA secure_delete = FAST")  # as the trim frees pages
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "UPDATE session_segments SET entries_json = ? WHERE session_id = ? AND seq = ?",
            rewrites,
        )
        conn.execute("COMMIT")
        record("floor", start)
        conn.close()
    f = {name: statistics.median(t) for name, t in times.items()}
    return [
        (
            "trim_tool_results, 1,000 segments (999 trimmed)",
            ms(f["first"]),
            faster(f["first"], f["first before"], 2),
        ),
        (
            "  trim again, idempotent (0 trimmed)",
            ms(f["again"]),
            faster(f["again"], f["again before"], 2),
        ),
        ("  floor: the 999 rows rewritten, text ready", ms(f["floor"]), ""),
    ]


def _trimmed_rows(path: Path) -> list[tuple[str, str, int]]:
    """``(entries_json, session_id, seq)`` of every row the first trim changes."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(_ROWS.format(""), ("s",)).fetchall()
    out = []
    for seq, _, data in rows[:-1]:
        entries, _count = trim_entries([entry_from_dict(i) for i in json.loads(data)], 400)
        out.append((encoded(entries), "s", seq))
    return out


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


async def processes_section(folder: Path) -> list[Row]:
    return bench_processes(folder)


SECTIONS: dict[str, Callable[[Path], Awaitable[list[Row]]]] = {
    "append": bench_append,
    "load": bench_load,
    "rewind": bench_rewind,
    "trim": bench_trim,
    "checkpoint": bench_checkpoint,
    "concurrency": bench_concurrency,
    "processes": processes_section,
}


async def main(only: set[str] | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-stores-") as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        rows: list[Row] = []
        for name, section in SECTIONS.items():
            if only is None or name in only:
                rows += await section(folder)
        width = max(len(r[0]) for r in rows)
        print(f"{'operation':<{width}}  {'result':>18}  target")
        print("-" * (width + 40))
        for name, value, target in rows:
            print(f"{name:<{width}}  {value:>18}  {target}")
        print(f"\n(total {time.perf_counter() - started:.1f} s, Python {sys.version.split()[0]})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=4, metavar=("DB", "NAME", "COUNT", "GO"))
    parser.add_argument("--only", help=f"comma-separated sections of: {', '.join(SECTIONS)}")
    args = parser.parse_args()
    if args.child:
        db, name, count, go = args.child
        asyncio.run(child(db, name, int(count), go))
    else:
        chosen = set(args.only.split(",")) if args.only else None
        if chosen and chosen - set(SECTIONS):
            parser.error(f"unknown sections {sorted(chosen - set(SECTIONS))}")
        asyncio.run(main(chosen))
