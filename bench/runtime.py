"""Run-loop benchmarks: overhead per run and per saved turn, and a long stream's memory.

Run from the repository root: ``python bench/runtime.py`` (under a minute).
SQLite figures use a real WAL file with ``synchronous=FULL``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from webapp import Agent, CheckpointOptions, InMemoryCheckpointer, InMemorySession, Runner, tool
from webapp.events import TextDelta
from webapp.models import OfflineModel, ScriptedModel
from webapp.stores.checkpoint import RunHead
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.stores.sqlite_session import SQLiteSession


@tool
def noop(i: int) -> str:
    """Do nothing."""
    return str(i)


async def runs_per_second(count: int, session, checkpointer) -> float:
    agent = Agent("a", model=ScriptedModel(["ok"] * count))
    start = time.perf_counter()
    for i in range(count):
        options = CheckpointOptions(checkpointer, f"run-{i}") if checkpointer else None
        await Runner.run(
            agent, "hi", session=session, session_id="s" if session else None, checkpoint=options
        )
    return count / (time.perf_counter() - start)


class TimedCheckpointer:
    """Times every save of a wrapped checkpointer, in order."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.times: list[float] = []

    async def append(self, run_id, entries, head: RunHead) -> None:
        start = time.perf_counter()
        await self.inner.append(run_id, entries, head)
        self.times.append(time.perf_counter() - start)

    async def load(self, run_id):
        return await self.inner.load(run_id)

    async def delete(self, run_id):
        await self.inner.delete(run_id)


async def save_cost_over_a_long_run(db: Path, turns: int) -> tuple[float, float]:
    """Median save time in the first and the last 20 turns of a ``turns``-turn tool loop."""
    script = [[("noop", {"i": i})] for i in range(turns)] + ["done"]
    timed = TimedCheckpointer(SQLiteCheckpointer(db, wal=True))
    agent = Agent("a", model=ScriptedModel(script), tools=[noop])
    await Runner.run(
        agent, "loop", checkpoint=CheckpointOptions(timed, "long"), max_turns=turns + 1
    )
    await timed.inner.close()
    saves = timed.times[1:]  # each turn saves twice: the call, then its result
    return statistics.median(saves[:40]), statistics.median(saves[-40:])


async def long_stream(n: int) -> tuple[float, float, int]:
    """Deltas per second and peak traced memory for "count to n" streamed to the end."""
    agent = Agent("a", model=OfflineModel(delay=0))
    tracemalloc.start()
    start = time.perf_counter()
    deltas = 0
    async for event in Runner.stream(
        agent, f"count to {n}", checkpoint=CheckpointOptions(InMemoryCheckpointer(), "c")
    ):
        deltas += isinstance(event, TextDelta)
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return deltas / elapsed, peak / 1e6, deltas


async def main() -> None:
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        rows.append(
            (
                "runs/s, no stores (200 one-turn runs)",
                f"{await runs_per_second(200, None, None):,.0f}",
            )
        )
        rows.append(
            (
                "runs/s, in-memory session + checkpoint",
                f"{await runs_per_second(200, InMemorySession(), InMemoryCheckpointer()):,.0f}",
            )
        )
        session, cp = SQLiteSession(db, wal=True), SQLiteCheckpointer(db, wal=True)
        rate = await runs_per_second(200, session, cp)
        await session.close()
        await cp.close()
        rows.append(("runs/s, SQLite WAL session + checkpoint (3 fsyncs a run)", f"{rate:,.0f}"))
        first, last = await save_cost_over_a_long_run(Path(tmp) / "long.db", 300)
        rows.append(
            ("checkpoint save, turns 1-20 of a 300-turn run (SQLite WAL)", f"{first * 1e3:.2f} ms")
        )
        rows.append(
            (
                "checkpoint save, turns 280-300 (flat = saves cost what they add)",
                f"{last * 1e3:.2f} ms ({last / first:.2f}x)",
            )
        )
    rate, peak, deltas = await long_stream(10_000)
    rows.append((f"stream 'count to 10000': {deltas:,} text deltas", f"{rate:,.0f} deltas/s"))
    rows.append(("peak Python memory of that run", f"{peak:.1f} MB"))
    width = max(len(r[0]) for r in rows)
    print(f"{'runtime benchmark'.ljust(width)}  figure")
    print(f"{'-' * width}  ------")
    for name, figure in rows:
        print(f"{name.ljust(width)}  {figure}")


if __name__ == "__main__":
    asyncio.run(main())
