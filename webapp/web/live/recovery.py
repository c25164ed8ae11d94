"""Runs the database says are owed, taken up again: at start-up, from a dead process, after a
decision.

A run is owed while its chat's ``active_run_id`` names it. After a crash, a
restart or (with other processes) the loss of its owner, `Recovery` looks at
what the run left -- a stop that was asked for, a checkpoint, or only the
input it was started with -- and either finishes its bookkeeping or resumes it
from its checkpoint under the same run id (`if_run_exists="resume_only"`). The text
its turn in flight had streamed is kept (`webapp.runtime.streaming`): the resumed
reply shows it at once and the run goes on from it; a stop or a failure found here
keeps it too.

A run that waits for a tool approval is owed too, but to the user: it is left
alone (``paused_runs``, `webapp.chats.tool_approvals`) until a decision, which
resumes it through `resumable` and `launch` like any other.
"""

from __future__ import annotations

import logging

from webapp.chats.store import EVERY_CHAT, Chat
from webapp.chats.tree import continued
from webapp.runtime import streaming
from webapp.runtime.options import CheckpointOptions
from webapp.stores.checkpoint import Checkpointer, RunSnapshot
from webapp.transcript import Entry, drop_dangling_tool_calls
from webapp.web.live.followers import publish_start
from webapp.web.live.host import RunHost
from webapp.web.live.reply import ReplyView, reply_from_entries, split_run
from webapp.web.live.run_state import REASONING, TEXT, RunState, run_input

logger = logging.getLogger("webapp.web.live.recovery")


class Recovery:
    """Resumes the owed runs of this process's runs (``runs``: what it uses of them)."""

    def __init__(self, runs: RunHost) -> None:
        self.runs = runs

    async def recover(self) -> int:
        """Resume every run the database says is still owed (with other processes: those
        no live process holds a lease on), except runs waiting for the user; returns
        how many resumed."""
        runs = self.runs
        owed = await runs.cluster.unowned()  # leaves waiting runs out itself
        resumed = 0
        for chat_id, run_id in owed:
            async with runs.lock(chat_id):
                try:
                    resumed += await self.take_over(chat_id, run_id)
                except Exception:
                    logger.exception("chat %s: could not recover run %s", chat_id, run_id)
        return resumed

    async def take_over(self, chat_id: str, run_id: str) -> int:
        """Resume one owed run (chat lock held), once this process holds its lease."""
        runs = self.runs
        chat = await runs.store.get(EVERY_CHAT, chat_id)
        running = runs.get(run_id)
        if chat is None or chat.active_run_id != run_id or (running and not running.finished):
            return 0
        epoch = runs.next_epoch()
        if not await runs.cluster.claim(run_id, chat_id, epoch):
            return 0  # another process was quicker
        with runs.cluster.fenced(run_id, epoch):
            state = await self._recover_one(chat, run_id, epoch)
        if state is None:
            await runs.cluster.release(run_id, epoch)
            return 0
        await self.launch(state)
        return 1

    async def _recover_one(self, chat: Chat, run_id: str, epoch: str) -> RunState | None:
        """The state to resume ``run_id`` with, or None when it only needed bookkeeping
        (stopped, failed or finished before the crash)."""
        runs = self.runs
        chat_id, continues = chat.id, chat.continues_run_id
        if chat.stop_requested_run_id == run_id:
            await runs.stop_orphan(chat, run_id)
            return None
        snapshot = await runs.checkpointer.load(run_id)
        if snapshot is None:
            if continues is not None:  # it finished: fold its stored segment in
                await runs.store.end_continuation(chat_id, run_id, continues, None, None)
                return None
            text = await runs.store.run_input(run_id)
            if text is not None and not await self._has_segment(chat_id, run_id):
                # The crash came before the run's first checkpoint: start it again.
                logger.info("chat %s: restarting run %s from its input", chat_id, run_id)
                state = runs.new_state(chat_id, run_id, text, ReplyView(run_id), epoch)
                state.input_attachments = await runs.store.files.run_attachments(run_id)
                state.from_input = True
                state.agent = await runs.agent_for(chat_id)
                return state
            await runs.store.end_run(chat_id, run_id)
            return None
        if snapshot.status == "failed":
            error = runs.redact(snapshot.head.error or "The run failed.")
            meta = {"status": "failed", "error": error}
            entries = await seen_entries(runs.checkpointer, snapshot)
            await runs.store_ended(chat_id, run_id, entries, meta, continues)
            return None
        logger.info("chat %s: resuming run %s (%s)", chat_id, run_id, snapshot.status)
        return await self.resumable(chat, run_id, snapshot, epoch)

    async def resumable(
        self, chat: Chat, run_id: str, snapshot: RunSnapshot, epoch: str
    ) -> RunState:
        """The state that resumes ``snapshot`` as attempt ``epoch``, with the decisions
        recorded for its waiting calls copied into its checkpoint first."""
        runs = self.runs
        await runs.pauses.before_resume(run_id, snapshot)
        turn = await streaming.resumable_turn(runs.checkpointer, run_id, snapshot.head.turns)
        entries = snapshot.entries + streaming.streamed_entries(turn)
        text, reply = await self.reply_from_checkpoint(chat, run_id, entries)
        await runs.pauses.mark(run_id, reply, snapshot)
        if chat.continues_run_id is not None:
            state = runs.continuing(chat.id, run_id, reply, epoch)
        else:
            state = runs.new_state(chat.id, run_id, text, reply, epoch)
            user, _ = split_run(snapshot.entries)
            state.input_attachments = user.attachments if user is not None else ()
        if turn is not None:  # the run goes on with that text: its deltas join it
            state.new_turn.discard(TEXT)
            if turn.reasoning:
                state.new_turn.discard(REASONING)
        state.agent = await runs.agent_for(chat.id)
        return state

    async def reply_from_checkpoint(
        self, chat: Chat, run_id: str, entries: list[Entry]
    ) -> tuple[str, ReplyView]:
        """(the user's text, the reply) of run ``run_id`` of ``chat`` from its checkpoint's
        ``entries``, as it streams: a continuation's joins the reply it continues. Calls
        without a result are kept: they run, or wait, next."""
        continues = chat.continues_run_id
        if continues is None:
            user, produced = split_run(entries)
            return (user.text if user else ""), reply_from_entries(run_id, produced, "streaming")
        segments = await self.runs.session.segments(chat.id)
        base = next(s for s in segments if s.run_id == continues)
        merged = continued(base.entries, entries)
        reply = reply_from_entries(continues, merged[1:], "streaming")
        reply.live_run_id = run_id
        return "", reply

    async def _has_segment(self, chat_id: str, run_id: str) -> bool:
        return any(s.run_id == run_id for s in await self.runs.session.segments(chat_id))

    async def launch(self, state: RunState) -> None:
        """Start a recovered run's task (its lease held), announced to other processes."""
        runs = self.runs
        await publish_start(runs.cluster, state)
        runs.drop_follower(state.run_id)  # pages that followed the dead attempt: show this one
        if state.from_input:  # it never saved a checkpoint: it starts from its input again
            options = CheckpointOptions(runs.checkpointer, state.run_id, if_run_exists="fail")
            runs.launch(state, run_input(state), options, runs.session)
            return
        options = CheckpointOptions(runs.checkpointer, state.run_id, if_run_exists="resume_only")
        runs.launch(state, [], options, runs.session)


async def seen_entries(checkpointer: Checkpointer, snapshot: RunSnapshot) -> list[Entry]:
    """A run's tool-consistent entries plus the text its turn in flight had streamed:
    what its reply showed when it stopped, failed or crashed."""
    turn = await streaming.resumable_turn(checkpointer, snapshot.run_id, snapshot.head.turns)
    return drop_dangling_tool_calls(snapshot.entries) + streaming.streamed_entries(turn)
