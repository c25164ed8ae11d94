"""A worker process for the approval crash tests: one step of run "job-7", may be killed.

usage: approval_worker.py DB LOG STEP ARG_JSON
STEP "start" runs the job with the scripted turns ARG; "resume" resumes it
(``if_run_exists="resume_only"``) with the turns ARG; "decide" records the
decisions ARG, prints "recorded" and waits to be killed. A tool named in the
environment's HANG_IN notes its effect in LOG, then blocks until the test kills
the process. "start" and "resume" print the result as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from webapp import (
    Agent,
    CheckpointOptions,
    Runner,
    SQLiteCheckpointer,
    SQLiteSession,
    record_decisions,
    tool,
)
from webapp.models import ScriptedModel

DB, LOG, STEP, ARG = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])


def note(name: str) -> None:
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(f"{name}\n")
        f.flush()
        os.fsync(f.fileno())


async def effect(name: str) -> str:
    note(name)
    if os.environ.get("HANG_IN") == name.split(":")[0]:
        await asyncio.sleep(3600)
    return f"did {name}"


@tool(approval="ask", rerunnable=False)
async def charge(amount: int) -> str:
    """Charge the card: asks first, never run twice by itself."""
    return await effect(f"charge:{amount}")


@tool(rerunnable=False)
async def transfer() -> str:
    """Move money: allowed, never run twice by itself."""
    return await effect("transfer")


@tool(approval="ask")
async def lookup(q: str) -> str:
    """Look something up: asks first, safe to run again."""
    return await effect(f"lookup:{q}")


async def main() -> None:
    async with SQLiteSession(DB, wal=True) as session, SQLiteCheckpointer(DB, wal=True) as cp:
        if STEP == "decide":
            await record_decisions(cp, "job-7", ARG)
            print("recorded", flush=True)
            await asyncio.sleep(3600)
        turns = [[tuple(call) for call in t] if isinstance(t, list) else t for t in ARG]
        model = ScriptedModel(turns)
        policy = "resume_only" if STEP == "resume" else "fail"
        result = await Runner.run(
            Agent("worker", model=model, tools=[charge, transfer, lookup]),
            [] if STEP == "resume" else "do the job",
            session=session,
            session_id="job-chat",
            checkpoint=CheckpointOptions(cp, "job-7", if_run_exists=policy),
        )
        segments = await session.segments("job-chat")
    pending = [[p.call.call_id, p.call.name, p.may_have_run] for p in result.interruptions]
    print(
        json.dumps(
            {
                "output": result.output,
                "pending": pending,
                "model_calls": len(model.requests),
                "segments": len(segments),
            }
        ),
        flush=True,
    )


asyncio.run(main())
