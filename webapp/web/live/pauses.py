"""Runs that wait for a tool approval, as the server keeps and shows them (SPEC §11).

When a model calls a tool that asks first, the run pauses (`webapp.runtime.approvals`):
its checkpoint is saved as interrupted, holding the waiting calls, and its task
ends. `Pauses` is what the web app adds, each part named for the failure it
prevents:

- `record`: a paused run is noted in ``paused_runs`` before its ``done`` record
  goes out, so from then on no recovery and no other process spends a task on
  it; the chat keeps its ``active_run_id``, so its other operations answer 409
  and Stop ends it as a stopped reply (`stop_orphan`, `webapp.web.live.runs`).
- `shown`: a waiting reply is read from the checkpoint each time a page shows
  it, never from a copy in memory: a decision in another tab or process, or a
  restart, cannot leave a page offering buttons for a call already decided.
- `decide`: one decision resumes the run exactly once. It runs under the chat's
  lock (a double click or a second tab waits for the first, then finds the run
  running here); with other processes it first takes the run's lease (one
  process wins, the others find the run running there); and it records the
  decision in the chat database before the resume, which copies it into the
  checkpoint (`before_resume`), so a restart between the click and the resume
  still applies it, once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from webapp.chats.store import Chat
from webapp.chats.tool_approvals import Decision
from webapp.events import RunPaused
from webapp.runtime.approvals import record_decisions
from webapp.stores.checkpoint import RunSnapshot
from webapp.transcript import ToolCallEntry
from webapp.web.live.host import RunHost
from webapp.web.live.reply import ReplyView
from webapp.web.live.run_state import RunState

logger = logging.getLogger("webapp.web.live.pauses")

SHOWN_EPOCH = "waiting"  # the epoch of a waiting reply read for a page: no log, no stream


class Pauses:
    """The paused runs of this process's runs (``runs``: what it uses of them)."""

    def __init__(self, runs: RunHost) -> None:
        self.runs = runs

    async def record(self, state: RunState, event: RunPaused) -> ReplyView:
        """The run paused (chat lock held): note it, and return its reply as it waits."""
        spent = [p.call.call_id for p in event.pending if p.may_have_run]
        await self.runs.store.approvals.pause(state.chat_id, state.run_id, spent)
        reply = state.reply
        for pending in event.pending:  # a call the stream never showed still gets its card
            reply.start_tool(pending.call)
        reply.status = "waiting"
        waiting = {p.call.call_id: p.may_have_run for p in event.pending}
        reply.mark_approvals(await self.runs.store.approvals.of_run(state.run_id), waiting)
        logger.info(
            "chat %s: run %s waits for approval of %s",
            state.chat_id,
            state.run_id,
            ", ".join(p.call.name for p in event.pending),
        )
        return reply

    async def shown(self, chat: Chat) -> RunState | None:
        """The chat's active run as it waits for a decision, read from its checkpoint
        (None if it does not wait): a finished state of its own, in no log."""
        run_id = chat.active_run_id
        if run_id is None:
            return None
        snapshot = await self.runs.checkpointer.load(run_id)
        if snapshot is None or snapshot.status != "interrupted" or not snapshot.head.pending:
            return None
        recovery = self.runs.recovery
        text, reply = await recovery.reply_from_checkpoint(chat, run_id, snapshot.entries)
        reply.status = "waiting"
        await self.mark(run_id, reply, snapshot)
        state = RunState(chat.id, run_id, SHOWN_EPOCH, text, reply)
        state.continues = chat.continues_run_id
        state.phase.finish()
        return state

    async def mark(self, run_id: str, reply: ReplyView, snapshot: RunSnapshot) -> None:
        """Each card of ``reply`` says what was decided, and which calls wait."""
        waiting = {str(p["call_id"]): bool(p.get("may_have_run")) for p in snapshot.head.pending}
        reply.mark_approvals(await self.runs.store.approvals.of_run(run_id), waiting)

    async def mark_decided(self, state: RunState, reply: ReplyView) -> None:
        """The cards of a run's final ``reply`` say what the user decided on them (a
        continuation's reply holds its own calls and those of the reply it continues)."""
        if not reply.tools:
            return
        approvals = self.runs.store.approvals
        decided = await approvals.of_run(state.continues) if state.continues else {}
        reply.mark_approvals({**decided, **await approvals.of_run(state.run_id)})

    async def before_resume(self, run_id: str, snapshot: RunSnapshot) -> None:
        """Copy the decisions the chat database holds for the run's waiting calls into
        its checkpoint (the first recorded stands in both), where the resume reads them."""
        head = snapshot.head
        if snapshot.status != "interrupted" or not head.pending:
            return  # a running head: its loop decides (and pauses again where it must)
        recorded = await self.runs.store.approvals.of_run(run_id)
        owed = {
            call_id: "deny" if recorded[call_id] == "deny" else "allow"
            for call_id in (str(p["call_id"]) for p in head.pending)
            if call_id in recorded and call_id not in head.decisions
        }
        if owed:
            await record_decisions(self.runs.checkpointer, run_id, owed)

    async def decide(
        self, chat: Chat, run_id: str, call_id: str, decision: Decision
    ) -> RunState | None:
        """The user's decision on waiting call ``call_id`` of ``chat``'s run ``run_id``
        (chat lock held): recorded, then the run resumed. Returns the run as it now goes
        on -- resumed now, or a moment ago by an earlier click -- or None when the call
        does not wait (decided, stopped, running in another process)."""
        runs = self.runs
        live = runs.get(run_id)
        if live is not None and live.chat_id == chat.id and not live.finished:
            return live  # the first click resumed it: this one changes nothing
        if chat.active_run_id != run_id:
            return None
        epoch = runs.next_epoch()
        if not await runs.cluster.claim(run_id, chat.id, epoch):
            return None  # another process holds it: it resumed the run a moment ago
        try:
            with runs.cluster.fenced(run_id, epoch):
                state = await self._resume(chat, run_id, call_id, decision, epoch)
        except BaseException:
            await runs.cluster.release(run_id, epoch)
            raise
        if state is None:
            await runs.cluster.release(run_id, epoch)
            return None
        await runs.recovery.launch(state)
        return state

    async def _resume(
        self, chat: Chat, run_id: str, call_id: str, decision: Decision, epoch: str
    ) -> RunState | None:
        runs = self.runs
        snapshot = await runs.checkpointer.load(run_id)
        calls = _decided_calls(snapshot, call_id, decision)
        if snapshot is None or not calls:
            return None
        grant = calls[call_id] if decision == "always" else None
        await runs.store.approvals.decide(
            chat.id, run_id, {c: decision for c in calls}, grant=grant
        )
        logger.info("chat %s: run %s: %s %s", chat.id, run_id, decision, ", ".join(calls))
        return await runs.recovery.resumable(chat, run_id, snapshot, epoch)


def _decided_calls(
    snapshot: RunSnapshot | None, call_id: str, decision: Decision
) -> Mapping[str, str]:
    """The waiting calls one decision settles (call id -> tool name): ``call_id`` and, for
    **Always allow**, every other call of that tool waiting in the run. Empty when
    ``call_id`` does not wait."""
    if snapshot is None or snapshot.status != "interrupted":
        return {}
    waiting = {str(p["call_id"]) for p in snapshot.head.pending}
    names = {
        e.call_id: e.name
        for e in snapshot.entries
        if isinstance(e, ToolCallEntry) and e.call_id in waiting
    }
    if call_id not in names:
        return {}
    if decision != "always":
        return {call_id: names[call_id]}
    return {c: name for c, name in names.items() if name == names[call_id]}
