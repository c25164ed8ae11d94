"""A worker process for the crash tests: runs one checkpointed call, may die mid-run.

usage: crash_worker.py DB LOG MODE TURNS_JSON
DB is a SQLite file, or a postgresql:// URL for the PostgreSQL stores.
MODE "exit" makes the `explode` tool call os._exit(3); MODE "hang" makes `hang`
block until the test kills the process; anything else lets both return.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from webapp import (
    Agent,
    CheckpointOptions,
    PostgresCheckpointer,
    PostgresSession,
    RunContext,
    Runner,
    SQLiteCheckpointer,
    SQLiteSession,
    tool,
)
from webapp.models import ScriptedModel

DB, LOG, MODE, TURNS = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])


def note(name: str, ctx: RunContext) -> None:
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(f"{name} {ctx.turn} {os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())


@tool
def record(ctx: RunContext, tag: str) -> str:
    """Record a side effect."""
    note(f"record:{tag}", ctx)
    return f"recorded {tag}"


@tool
def explode(ctx: RunContext) -> str:
    """Dies in MODE exit."""
    note("explode", ctx)
    if MODE == "exit":
        os._exit(3)
    return "survived"


@tool
async def hang(ctx: RunContext) -> str:
    """Blocks in MODE hang."""
    note("hang", ctx)
    if MODE == "hang":
        await asyncio.sleep(3600)
    return "released"


async def main() -> None:
    turns = [[tuple(call) for call in t] if isinstance(t, list) else t for t in TURNS]
    model = ScriptedModel(turns)
    agent = Agent("worker", model=model, tools=[record, explode, hang])
    if DB.startswith("postgresql://"):
        session, cp = PostgresSession(DB), PostgresCheckpointer(DB)
    else:
        session, cp = SQLiteSession(DB, wal=True), SQLiteCheckpointer(DB, wal=True)
    async with session, cp:
        result = await Runner.run(
            agent,
            "do the job",
            session=session,
            session_id="job-chat",
            checkpoint=CheckpointOptions(cp, "job-42"),
        )
    print(json.dumps({"output": result.output, "model_calls": len(model.requests)}), flush=True)


asyncio.run(main())
