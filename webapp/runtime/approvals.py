"""Tool approval as a durable pause (SPEC §11), and what a resume does with calls
left without a result (SPEC §3).

A tool whose ``approval`` is "ask" does not run until the user allows it. When
a model turn calls one, the allowed calls of that turn run, and then the run
*pauses*: its checkpoint is saved as interrupted with the waiting calls
dangling and listed in ``RunHead.pending``; no task waits in memory. A caller
records the user's answers with `record_decisions` -- durable before anything
runs -- and resumes the run (``if_run_exists="resume_only"``).

The head carries three things between processes:

- ``pending``: the calls waiting for a decision, ``{"call_id", "may_have_run"}``;
- ``decisions``: ``call_id -> "allow" | "deny"``; the first one recorded stands,
  so a double click, a second tab or a second process changes nothing;
- ``started``: the calls of non-rerunnable tools whose invocation began, saved
  before the tool runs, so a crash during one is known afterwards.

`settle` applies the rules to each call without a result, in the model's order;
the first rule that matches wins:

1. it is in ``started`` (a crash cut it short): pending again, may have run; its
   old decision is spent, so the user decides again;
2. decided "deny": the error result `DECLINED`, which the model reads;
3. not decided, and pending before or its tool asks: still pending;
4. otherwise it runs -- decided "allow", an allowed tool's fresh call, or a
   rerunnable tool's call a crash left dangling (the seed's at-least-once
   resume, same turn number); a non-rerunnable tool's call is first recorded in
   ``started``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Literal, Protocol

from webapp.errors import UserError
from webapp.events import PendingApproval
from webapp.runtime.agent import Agent
from webapp.runtime.options import CheckpointOptions
from webapp.runtime.tool import Tool
from webapp.stores.checkpoint import Checkpointer, RunHead
from webapp.transcript import ToolCallEntry, ToolResultEntry

DECLINED = "The user declined to run this tool."
DECISIONS = ("allow", "deny")


class ToolRun(Protocol):
    """What `settle` needs of the run loop (`webapp.runtime.runner`)."""

    head: RunHead

    async def run_tool(
        self,
        tools: Mapping[str, Tool],
        call: ToolCallEntry,
        declined: ToolResultEntry | None = None,
    ) -> None:
        """Invoke the call (or take ``declined`` as its result), store the result, save."""
        ...

    async def save(self) -> None: ...


async def settle(
    run: ToolRun, tools: Mapping[str, Tool], calls: Sequence[ToolCallEntry]
) -> list[PendingApproval]:
    """Run, decline or hold each call; returns the calls still waiting for the user.

    ``run.head`` leaves with ``pending`` set to them (the caller's next save
    stores it) and ``started`` empty: every started call now has a result or
    waits again.
    """
    waiting = {p["call_id"]: bool(p.get("may_have_run")) for p in run.head.pending}
    pending: list[PendingApproval] = []
    for call in calls:
        step = _step(call, tools.get(call.name), run.head, waiting)
        if isinstance(step, PendingApproval):
            pending.append(step)
            if step.may_have_run:
                run.head = _forget(run.head, call.call_id)
            continue
        # Out of `pending` with the save that stores its result (or marks it started).
        run.head = replace(
            run.head, pending=[p for p in run.head.pending if p["call_id"] != call.call_id]
        )
        if step == "deny":
            await run.run_tool(tools, call, ToolResultEntry(call.call_id, DECLINED, True))
            continue
        if step == "mark":
            run.head = replace(run.head, started=[*run.head.started, call.call_id])
            await run.save()  # durable before the tool runs: a crash in it is known
        await run.run_tool(tools, call)
    run.head = replace(run.head, pending=[_stored(p) for p in pending], started=[])
    return pending


def _step(
    call: ToolCallEntry, found: Tool | None, head: RunHead, waiting: Mapping[str, bool]
) -> PendingApproval | Literal["run", "mark", "deny"]:
    # An unknown tool's call "runs" into an error result at once: nothing to approve.
    approval, rerunnable = (found.approval, found.rerunnable) if found else ("allow", True)
    decision = head.decisions.get(call.call_id)
    if call.call_id in head.started:
        return PendingApproval(call, may_have_run=True)
    if decision == "deny":
        return "deny"
    if decision is None and (call.call_id in waiting or approval == "ask"):
        return PendingApproval(call, waiting.get(call.call_id, False))
    return "run" if rerunnable else "mark"


def _forget(head: RunHead, call_id: str) -> RunHead:
    """A call that may have run waits for a new decision: the old one is spent."""
    decisions = {k: v for k, v in head.decisions.items() if k != call_id}
    return replace(head, decisions=decisions, started=[s for s in head.started if s != call_id])


def _stored(pending: PendingApproval) -> dict[str, object]:
    return {"call_id": pending.call.call_id, "may_have_run": pending.may_have_run}


async def record_decisions(
    checkpointer: Checkpointer, run_id: str, decisions: Mapping[str, str]
) -> dict[str, str]:
    """Store the user's decisions (``call_id -> "allow" | "deny"``) for a paused run's
    waiting calls, before anything runs; then resume the run to apply them.

    A call already decided keeps its first decision (a double click is a no-op).
    Returns the decision now recorded for each call id given. Raises `UserError`
    for an unknown run, a call that is not waiting, or a run being resumed.
    """
    snapshot = await checkpointer.load(run_id)
    if snapshot is None:
        raise UserError(f"no stored run {run_id!r} to record decisions for; check the run_id")
    head = snapshot.head
    waiting = {p["call_id"] for p in head.pending}
    new: dict[str, str] = {}
    for call_id, decision in decisions.items():
        if decision not in DECISIONS:
            raise UserError(
                f"decision for {call_id!r} must be one of {DECISIONS}, got {decision!r}"
            )
        if call_id in head.decisions:
            continue  # the first decision stands
        if call_id not in waiting:
            raise UserError(
                f"call {call_id!r} of run {run_id!r} is not waiting for a decision; "
                f"waiting: {sorted(waiting) or 'none'}"
            )
        new[call_id] = decision
    if new and head.status == "running":
        # Its loop would overwrite the head, and with it these decisions.
        raise UserError(
            f"run {run_id!r} is running (or its process died while it ran); resume it "
            "first, then record decisions for the calls it still waits for"
        )
    recorded = {**head.decisions, **new}
    if new:
        await checkpointer.append(
            run_id, [], replace(head, decisions=recorded, updated_at=time.time())
        )
    return {call_id: recorded[call_id] for call_id in decisions}


async def record_for_resume(
    checkpoint: CheckpointOptions | None, decisions: Mapping[str, str]
) -> None:
    """``Runner.run(..., decisions=)``: record them in the run the options resume."""
    if (
        checkpoint is None
        or checkpoint.resume_from is not None
        or checkpoint.if_run_exists
        in (
            "restart",
            "fail",
        )
    ):
        raise UserError(
            "decisions= resumes a stored run: pass checkpoint=CheckpointOptions(checkpointer, "
            "run_id, if_run_exists='resume_only'), without resume_from"
        )
    await record_decisions(checkpoint.checkpointer, checkpoint.run_id, decisions)


def check_can_pause(agent: Agent, checkpoint: CheckpointOptions | None) -> None:
    """A run waits for a decision in its checkpoint: without one it could never resume."""
    if checkpoint is not None:
        return
    asking = sorted({t.name for a in agent.graph() for t in a.tools if t.approval == "ask"})
    if asking:
        raise UserError(
            f"tools {', '.join(asking)} ask for approval, and a run can only wait for it in "
            "a checkpoint: pass checkpoint=CheckpointOptions(checkpointer, run_id)"
        )


__all__ = ["DECLINED", "ToolRun", "check_can_pause", "record_decisions", "settle"]
