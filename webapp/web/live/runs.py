"""Runs owned by the server: one task per run, each with an ordered, numbered event log.

A browser tab only *watches* a run. The run's events update the live reply
and become records (seq, SSE event name, HTML fragment) of the run's log
(`webapp.web.live.recorder`), handed over by the run's own task as it emits
them. Any number of clients read the
log by index from any position, so a refresh, a dropped connection or a
second tab continues with no gap and no duplicate, and closing a tab never
stops the run.

Every change of a chat's run state happens under that chat's asyncio lock,
which this manager hands out (`lock`): the chat operations of
`webapp.web.chat_service` hold it to start, stop or discard a run, and a
run's own task holds it for its final bookkeeping (session append for
stopped/failed runs, checkpoint delete, clearing ``active_run_id``). So an
action taken right after a stop never races it, and a run is never started
twice in one chat. Methods that say "chat lock held" expect the caller to
hold it.

The log's ``done`` record is appended only after the run's outcome is
durable, so a client that sees the final reply can act on it at once.

With other processes a run's writes are fenced by its lease (`Cluster.fenced`):
one taken over elsewhere while this process stalled ends here recording nothing.
Alone, the process has the `LocalCluster`: the same code path, with nobody to
agree with.

Live runs publish, the web renders: a run's state is the plain record of what it
produced (`webapp.web.live.reply.ReplyView`), and the HTML each log record
carries is drawn by the renderer the app passes in (`Renderer`, the web's
`Fragments`), so nothing here knows a template.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from webapp.chats.store import EVERY_CHAT, Begun, Chat, ChatStore, NewRun
from webapp.events import (
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    TerminalEvent,
)
from webapp.models.endpoints import model_name
from webapp.runtime.agent import Agent
from webapp.runtime.options import CheckpointOptions
from webapp.runtime.runner import Runner
from webapp.stores.checkpoint import Checkpointer
from webapp.stores.cluster import Cluster
from webapp.stores.postgres import FencedOffError
from webapp.stores.session import Session
from webapp.transcript import Entry, UserEntry, drop_dangling_tool_calls
from webapp.web.live.chat_locks import ChatLocks
from webapp.web.live.followers import Followers, publish_start, reply_to_json
from webapp.web.live.host import Renderer
from webapp.web.live.pauses import Pauses
from webapp.web.live.readers import Readers
from webapp.web.live.recorder import Recorder
from webapp.web.live.recovery import Recovery, seen_entries
from webapp.web.live.reply import (
    ReplyStatus,
    ReplyView,
    annotate,
    reply_from_entries,
    split_run,
)
from webapp.web.live.run_end import NoObserver, RunObserver, retried
from webapp.web.live.run_state import DONE, TEXT, Ending, RunState, run_input

logger = logging.getLogger("webapp.web.live.runs")

STOP_TIMEOUT = 30.0  # a cancelled run answers within a model chunk or a tool call
ENDED_POLL = 0.05  # seconds between looks at a run another process is stopping


class RunManager:
    """Starts, stops, finalizes and recovers the chat app's runs."""

    def __init__(
        self,
        *,
        agent: Agent,
        agent_for: Callable[[str], Awaitable[Agent]] | None = None,
        session: Session,
        checkpointer: Checkpointer,
        store: ChatStore,
        fragments: Renderer,
        cluster: Cluster,
        redact: Callable[[str], str] = lambda s: s,
        max_turns: int = 20,
    ) -> None:
        self.agent = agent
        self._agent_for = agent_for  # a chat's own agent (its tools, model, instructions)
        self.session = session
        self.checkpointer = checkpointer
        self.store = store
        self.fragments = fragments
        self.redact = redact
        self.max_turns = max_turns
        self.cluster = cluster  # the other processes (PostgresCluster), or none (LocalCluster)
        self.followers = Followers(cluster)  # runs another process executes
        self.recorder = Recorder(fragments, cluster)  # a run's events into its log
        self._attempts = itertools.count(1)
        self._runs: dict[str, RunState] = {}
        self._latest: dict[str, str] = {}  # chat_id -> run_id of its newest run
        self.readers = Readers(self._forget_run)  # a finished run nobody reads goes
        self._locks = ChatLocks()  # dropped once unused: flat over any number of chats
        self._tasks: set[asyncio.Task[None]] = set()
        self.recovery = Recovery(self)  # owed runs taken up again (start-up, takeover)
        self.pauses = Pauses(self)  # runs waiting for a tool approval
        self.observer: RunObserver = NoObserver()  # the metrics, when the app has them

    async def agent_for(self, chat_id: str) -> Agent:
        """The agent a run of ``chat_id`` starts (or resumes) with."""
        return await self._agent_for(chat_id) if self._agent_for is not None else self.agent

    # --- lookup -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lock(self, chat_id: str) -> AsyncIterator[None]:
        """The chat's lock: this process's, and with other processes theirs too."""
        async with self._locks.hold(chat_id), self.across_processes(chat_id):
            yield

    @contextlib.asynccontextmanager
    async def across_processes(self, key: str) -> AsyncIterator[None]:
        """Hold ``key``'s lock against other processes (nothing to hold without them)."""
        async with self.cluster.chat_lock(key):
            yield

    def get(self, run_id: str) -> RunState | None:
        """A run this process executes (or executed last in its chat)."""
        return self._runs.get(run_id)

    async def follow(self, chat_id: str, run_id: str) -> RunState | None:
        """A run executed here, or else one another process executes (read from the
        database); None when neither knows it."""
        state = self._runs.get(run_id)
        if state is not None:
            return state if state.chat_id == chat_id else None
        return await self.followers.follow(chat_id, run_id)

    async def catch_up(self, state: RunState, seq: int) -> None:
        """A followed run read up to ``seq`` at least, if it gets there soon."""
        if state.follower:
            await self.followers.catch_up(state, seq)

    async def live(self, chat: Chat) -> RunState | None:
        """The chat's newest run as far as this process can show it. A run waiting for
        a tool approval is read from the database each time (`Pauses.shown`): a decision
        elsewhere may have resumed it."""
        state = self.latest(chat.id)
        active = chat.active_run_id
        if active is not None and (state is None or state.run_id != active or state.paused):
            followed = await self.follow(chat.id, active)
            if followed is not None and followed.paused:
                followed = await self.followers.follow(chat.id, active)  # resumed elsewhere?
            if followed is None or followed.paused:
                followed = await self.pauses.shown(chat) or followed
            state = followed or state
        return state

    def latest(self, chat_id: str) -> RunState | None:
        run_id = self._latest.get(chat_id)
        return self._runs.get(run_id) if run_id else None

    def _forget_run(self, state: RunState) -> None:
        """Drop a finished run's live state nobody reads (`Readers`); one that waits for
        an approval, or that another process may take over, stays."""
        if not state.finished or state.paused or state.abandoned or state.lease_lost:
            return
        if self._runs.get(state.run_id) is state:
            del self._runs[state.run_id]
            if self._latest.get(state.chat_id) == state.run_id:
                del self._latest[state.chat_id]

    def drop_follower(self, run_id: str) -> None:
        self.followers.drop(run_id)

    def forget_chat(self, chat_id: str) -> None:
        run_id = self._latest.pop(chat_id, None)
        if run_id is not None:
            self._runs.pop(run_id, None)

    # --- starting -----------------------------------------------------------------

    async def start(
        self,
        chat_id: str,
        new: NewRun,
        text: str,
        *,
        continues: ReplyView | None = None,
        page: int | None = None,
        entries: list[Entry] | None = None,
    ) -> tuple[RunState, Begun]:
        """Record ``new`` in the chat and, once that is committed, start it (chat lock
        held, no run active). Returns the run, with the chat as its record left it and,
        with ``page``, the chat's latest page of that many runs, read with it
        (`ChatStore.begin_run`).

        A continuation (``continues``: the reply it goes on with) runs with no
        input; its text streams into that reply. ``entries``: the run's input as
        entries instead of ``text`` (``[]``: none, the session's history is the whole
        request -- an API request that brings tool results).
        """
        # The input and the agent's model go with the run's record, committed before the
        # run starts: a crash before the run's first checkpoint restarts it from there
        # (see `Recovery`), and nothing the run writes can outlive a record that failed.
        agent = await self.agent_for(chat_id)
        model = model_name(agent.model)
        record = replace(new, model=model, input=text if continues is None else new.input)
        begun = await self.store.begin_run(chat_id, record, page=page)
        if continues is None:
            state = self.new_state(chat_id, new.run_id, text, ReplyView(new.run_id))
        else:
            state = self.continuing(chat_id, new.run_id, continues)
        state.input_attachments = new.attachments if continues is None else ()
        # A new run: nobody else can hold its lease.
        await self.cluster.claim(state.run_id, chat_id, state.epoch)
        await publish_start(self.cluster, state)
        state.agent = agent
        # Not deleted on success: `end_run` drops the checkpoint with the chat's own update.
        options = CheckpointOptions(self.checkpointer, new.run_id, if_run_exists="fail")
        given: str | list[Entry] = run_input(state) if entries is None else entries
        self.launch(state, [] if continues is not None else given, options, self.session)
        return state, begun

    def continuing(
        self, chat_id: str, run_id: str, reply: ReplyView, epoch: str | None = None
    ) -> RunState:
        shown = ReplyView(reply.run_id, "streaming", reply.text, reply.reasoning, list(reply.tools))
        shown.live_run_id = run_id
        state = self.new_state(chat_id, run_id, "", shown, epoch)
        state.continues = reply.run_id
        if reply.text:  # the first delta goes on from the partial text
            state.new_turn.discard(TEXT)
        return state

    def new_state(
        self, chat_id: str, run_id: str, text: str, reply: ReplyView, epoch: str | None = None
    ) -> RunState:
        state = RunState(chat_id, run_id, epoch or self.next_epoch(), text, reply)
        old = self._latest.get(chat_id)
        if old is not None and old != run_id:
            self._runs.pop(old, None)  # its clients fall back to the stored reply
        self._runs[run_id] = state
        self._latest[chat_id] = run_id
        return state

    def next_epoch(self) -> str:
        return f"{self.cluster.owner}.{next(self._attempts)}"

    def launch(
        self, state: RunState, text: str | list[Entry], options: CheckpointOptions, session: Session
    ) -> None:
        with self.cluster.fenced(state.run_id, state.epoch):  # the run's own task inherits it
            state.handle = Runner.stream(
                state.agent or self.agent,
                text,
                session=session,
                session_id=state.chat_id,
                checkpoint=options,
                max_turns=self.max_turns,
            )
        task = asyncio.get_running_loop().create_task(
            self._consume(state), name=f"chat-run-{state.run_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.observer.run_started()

    async def _consume(self, state: RunState) -> None:
        """The run's own task: events into the log, then the final bookkeeping."""
        handle = state.handle
        if handle is None:
            raise RuntimeError(f"run {state.run_id} was launched without a handle")
        try:
            # The run's own task hands each event over as it comes: no wake-up here per
            # token (a bug in recording fails the run instead of stalling it).
            event = await handle.events_to(lambda event: self.recorder.take(state, event))
            self.recorder.flush(state)
            if not state.terminal.done():
                state.terminal.set_result(event)
            async with self.lock(state.chat_id):
                await self._finalize(state)
        except Exception:  # a bug here must not vanish into an unobserved task
            logger.exception("run %s: the server task failed", state.run_id)
            raise

    # --- the end of a run -------------------------------------------------------------

    async def _finalize(self, state: RunState) -> None:
        """Make the run's outcome durable, then publish the final reply (chat lock held)."""
        if state.finished or not state.terminal.done():
            return
        if state.discarded:  # its chat was deleted with everything the run wrote
            state.phase.finish()
            state.append_nothing()
            await self._release_lease(state)
            return
        event = state.terminal.result()
        if isinstance(event, RunFailed) and isinstance(event.error, FencedOffError):
            state.phase.end_for(Ending.LEASE_LOST)  # taken over: its own write was refused
        if state.lease_lost or (isinstance(event, RunCancelled) and not state.stop_requested):
            # Server shutdown (or a lease lost): the checkpoint resumes the run in the
            # next process. No `done` record: clients reconnect and continue there.
            state.phase.abandon()
            state.append_nothing()
            return
        try:
            with self.cluster.fenced(state.run_id, state.epoch):
                reply = await retried(
                    lambda: self._record_outcome(state, event),
                    f"run {state.run_id}: recording its outcome",
                    self.observer,
                )
            await self.pauses.mark_decided(state, reply)  # Allowed / Denied stay on the cards
            # The finished reply keeps its switcher, model and usage (its part of the tree).
            tree = await self.store.tree_around(state.chat_id, [reply.run_id])
            annotate(reply, tree.versions([tree.nodes[reply.run_id]]))
        except FencedOffError:  # taken over elsewhere: that attempt records the outcome
            logger.warning("run %s: another process took it over; nothing recorded", state.run_id)
            state.phase.end_for(Ending.LEASE_LOST)
            state.phase.abandon()
            state.append_nothing()
            return
        except Exception as exc:  # the store failed: say so on the reply, release the chat
            logger.exception("run %s: could not record its outcome", state.run_id)
            reply = state.reply
            reply.status, reply.error = "failed", f"The reply could not be saved: {exc}"
            await self._release(state, reply.error)
        await self.fragments.draw([reply])  # its Markdown, off the event loop
        state.reply = reply
        state.phase.finish()
        html = self.fragments.final_reply(state.chat_id, reply)
        self.recorder.record(state, DONE, html, {"reply": reply_to_json(reply)})
        await self._release_lease(state)
        self.readers.finished(state)
        self.observer.run_ended(
            reply.status, getattr(getattr(event, "result", None), "usage", None)
        )
        logger.info(
            "chat %s: run %s %s (%d characters, %d tool calls)",
            state.chat_id,
            state.run_id,
            reply.status,
            len(reply.text),
            len(reply.tools),
        )

    async def _release(self, state: RunState, reason: str) -> None:
        """Its outcome could not be recorded: release the chat, the run marked failed
        (`webapp.web.live.run_end`); if even that fails, the next start recovers it."""
        meta = {"status": "failed", "error": self.redact(reason)}
        kept: list[Entry] = (
            [UserEntry(state.input_text, state.input_attachments)]
            if state.continues is None
            else []
        )
        try:
            with self.cluster.fenced(state.run_id, state.epoch):
                await retried(
                    lambda: self.store.release_run(state.chat_id, state.run_id, meta, kept),
                    f"run {state.run_id}: releasing its chat",
                    self.observer,
                )
        except Exception:
            logger.exception("run %s: could not release its chat either", state.run_id)

    async def _record_outcome(self, state: RunState, event: TerminalEvent) -> ReplyView:
        chat_id, run_id = state.chat_id, state.run_id
        meta: dict[str, Any] | None = None
        if isinstance(event, RunCompleted):
            _, produced = split_run(event.result.entries)
            if event.result.finish_reason == "length":
                meta = {"finish_reason": "length"}
            if state.continues is None:
                await self.store.end_run(chat_id, run_id)
                return reply_from_entries(run_id, produced, "completed", meta=meta)
            entries = await self.store.end_continuation(
                chat_id, run_id, state.continues, produced, meta
            )
            return reply_from_entries(state.continues, entries[1:], "completed", meta=meta)
        if isinstance(event, RunPaused):  # it waits for the user; the chat keeps it active
            return await self.pauses.record(state, event)
        entries = drop_dangling_tool_calls(event.entries)
        if isinstance(event, RunCancelled):
            meta = {"status": "stopped"}
        else:
            error = event.error
            meta = {"status": "failed", "error": self.redact(str(error) or type(error).__name__)}
        if state.continues is None and (not entries or not isinstance(entries[0], UserEntry)):
            # Refused before its first save: keep the user's message anyway.
            entries = [UserEntry(state.input_text, state.input_attachments), *entries]
        kept = await self.store_ended(chat_id, run_id, entries, meta, state.continues)
        status: ReplyStatus = "stopped" if isinstance(event, RunCancelled) else "failed"
        return reply_from_entries(state.continues or run_id, kept[1:], status, meta=meta)

    async def store_ended(
        self,
        chat_id: str,
        run_id: str,
        entries: list[Entry],
        meta: dict[str, Any],
        continues: str | None = None,
    ) -> list[Entry]:
        """A stopped or failed run: its tool-consistent entries become a segment under
        its own run_id (a continuation's join the reply it continues), then its
        checkpoint goes (a resume would write them again). Returns the segment's entries."""
        if continues is not None:
            return await self.store.end_continuation(chat_id, run_id, continues, entries, meta)
        if entries:
            await self.session.append(chat_id, entries, run_id=run_id, meta=meta)
        await self.store.end_run(chat_id, run_id)  # and the checkpoint goes with it
        return entries

    async def settle(self, chat_id: str) -> None:
        """Finish the bookkeeping of a run whose terminal event already arrived.

        Called under the chat lock by actions that need the chat idle: a run
        that ended a moment ago must not make them answer 409.
        """
        state = self.latest(chat_id)
        if state is not None and state.terminal.done() and not state.finished:
            await self._finalize(state)

    # --- stop and discard (chat lock held) --------------------------------------------

    async def stop(self, state: RunState) -> None:
        """Stop a live run and keep what it produced; a no-op for a finished one."""
        if state.finished:
            return
        await self.store.request_stop(state.chat_id, state.run_id)
        state.phase.end_for(Ending.STOP)
        if not await self._cancel(state):
            return
        await self._finalize(state)

    async def stop_unowned(self, chat: Chat, run_id: str) -> bool:
        """A stop for the chat's active run ``run_id``, which this process does not
        execute. If another process does, ask it (False: wait for the run to end, see
        `wait_ended`); else store what its checkpoint holds as stopped (True)."""
        await self.store.request_stop(chat.id, run_id)
        epoch = self.next_epoch()
        if not await self.cluster.claim(run_id, chat.id, epoch):
            await self.cluster.request_stop(run_id)
            return False
        with self.cluster.fenced(run_id, epoch):
            await self.stop_orphan(chat, run_id)
        await self.cluster.release(run_id, epoch)
        return True

    async def wait_ended(self, chat_id: str, run_id: str) -> None:
        """Wait (chat lock not held) until ``run_id`` is no longer the chat's active run."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_TIMEOUT
        while loop.time() < deadline:
            chat = await self.store.get(EVERY_CHAT, chat_id)
            if chat is None or chat.active_run_id != run_id:
                return
            await asyncio.sleep(ENDED_POLL)
        logger.error("run %s was not stopped by its process within %ss", run_id, STOP_TIMEOUT)

    async def stop_orphan(self, chat: Chat, run_id: str) -> None:
        """A stop for a run the chat owes but no task runs (a crash interrupted it):
        store what its checkpoint holds as stopped."""
        await self.store.request_stop(chat.id, run_id)
        snapshot = await self.checkpointer.load(run_id)
        entries = await seen_entries(self.checkpointer, snapshot) if snapshot is not None else []
        await self.store_ended(
            chat.id, run_id, entries, {"status": "stopped"}, chat.continues_run_id
        )

    async def discard(self, state: RunState) -> None:
        """Cancel a live run whose chat is being deleted: it records nothing more."""
        state.phase.end_for(Ending.DISCARD)
        if not state.finished:
            await self._cancel(state)

    async def _cancel(self, state: RunState) -> bool:
        """Cancel the run and wait for its terminal event; False if it did not come."""
        if state.handle is not None:
            state.handle.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(state.terminal), STOP_TIMEOUT)
        except TimeoutError:
            logger.error("run %s did not stop within %ss", state.run_id, STOP_TIMEOUT)
            return False
        return True

    def reply_html(self, state: RunState) -> str:
        """A run's reply as it is now: streaming from the current position, or final."""
        if state.finished:
            return self.fragments.final_reply(state.chat_id, state.reply)
        return self.fragments.reply(state.chat_id, state.reply, state.position)

    # --- start-up and shutdown --------------------------------------------------------

    async def recover(self) -> int:
        """Resume every run the database says is still owed (`Recovery.recover`)."""
        return await self.recovery.recover()

    async def _release_lease(self, state: RunState) -> None:
        """The run's records are written for the other processes, its lease released."""
        if state.follower:
            return
        try:
            await self.cluster.flush()
            await self.cluster.release(state.run_id, state.epoch)
        except Exception:  # the lease expires by itself; the next owner finds the run done
            logger.exception("run %s: could not release its lease", state.run_id)

    # --- with other processes (webapp.web.live.lease_keeper calls these) ----------------------

    def wake_followers(self, run_id: str) -> None:
        """Another process wrote events of ``run_id`` ("*": of any run)."""
        self.followers.wake(run_id)

    async def poll_followers(self, now: float) -> None:
        await self.followers.poll(now)

    def owned(self) -> dict[str, RunState]:
        """The runs this process executes right now, by run id."""
        return {
            r: s
            for r, s in self._runs.items()
            if not s.finished and not s.follower and s.handle is not None
        }

    def give_up(self, state: RunState) -> None:
        """Its lease is lost: another process may resume it; this one records nothing."""
        state.phase.end_for(Ending.LEASE_LOST)
        if state.handle is not None:
            state.handle.cancel()  # finalized as abandoned: nothing recorded here

    def stop_asked(self, run_id: str) -> None:
        """Another process asked to stop ``run_id``: if it runs here, stop it (its own
        task records the stop under the chat lock)."""
        state = self._runs.get(run_id)
        if state is None or state.finished or state.handle is None:
            return
        state.phase.end_for(Ending.STOP)
        state.handle.cancel()

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Interrupt every live run; their checkpoints resume them in the next process
        to start (with other processes: in one of them, see `webapp.web.live.lease_keeper`)."""
        for state in list(self._runs.values()):
            if state.handle is not None and not state.finished:
                state.handle.cancel()
        tasks = list(self._tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
