"""A worker process for the crash tests: runs one checkpointed call, may die mid-run.

usage: crash_worker.py DB LOG MODE TURNS_JSON
DB is a SQLite file, or a postgresql:// URL for the PostgreSQL stores.
MODE "exit" makes the `explode` tool call os._exit(3); MODE "hang" makes `hang`
block until the test kills the process; anything else lets both return. MODE
"stream" streams text turns a word every 10 ms and appends each word, as it is
streamed, to LOG + ".text" (what a reader of the reply saw).
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
from webapp.events import TextDelta
from webapp.models import ScriptedModel
from webapp.transcript import entry_to_dict

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
    model = ScriptedModel(turns, chunk_delay=0.01 if MODE == "stream" else 0.0)
    agent = Agent("worker", model=model, tools=[record, explode, hang])
    if DB.startswith("postgresql://"):
        session, cp = PostgresSession(DB), PostgresCheckpointer(DB)
    else:
        session, cp = SQLiteSession(DB, wal=True), SQLiteCheckpointer(DB, wal=True)
    async with session, cp:
        handle = Runner.stream(
            agent,
            "do the job",
            session=session,
            session_id="job-chat",
            checkpoint=CheckpointOptions(cp, "job-42"),
        )
        with open(LOG + ".text", "a", encoding="utf-8") as seen:  # noqa: ASYNC230 -- a test's log
            async for event in handle:
                if isinstance(event, TextDelta):
                    seen.write(event.text)
                    seen.flush()
        result = await handle.result()
    out = {"output": result.output, "model_calls": len(model.requests)}
    if MODE == "stream":
        out["requests"] = [[entry_to_dict(e) for e in r] for r in model.requests]
        out["continued"] = model.continued
    print(json.dumps(out), flush=True)


asyncio.run(main())
