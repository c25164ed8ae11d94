"""Runs another process executes, followed from the database (several processes only).

A page or an event stream served by this process may show a run that another
process executes. `Followers` rebuilds such a run as a `RunState` from the
owner's ``run_events`` rows (`webapp.stores.postgres_cluster`; with one process
alone, `webapp.web.live.local_cluster`, there is never another owner to follow): the same records with the
same positions, and the same live reply, built from each record's change
(``delta``). The SSE stream then reads it exactly as it reads a local run.

A follower is brought up to date when the owner's ``NOTIFY`` says it wrote
events, and on the cluster's timer in any case. When the run's lease passes
to another attempt (the owner died or shut down, and another process resumed
the run) without a ``done`` record, the follower is marked abandoned: its
streams end, the browsers reconnect, and the next request follows the new
attempt (a new epoch: the client gets a reset to the reply as it stands).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict
from typing import Any

from webapp.stores.cluster import Cluster, EventRow
from webapp.transcript import Attachment
from webapp.usage import Usage
from webapp.web.live.reply import ReplyView, ToolCard
from webapp.web.live.run_state import DONE, REASONING, TEXT, TOOL, RunState

logger = logging.getLogger("webapp.web.live.followers")

KEEP_FINISHED = 60.0  # seconds a finished follower stays for late readers
CATCH_UP_SECONDS = 2.0  # how long a client ahead of this copy waits for it


def reply_to_json(reply: ReplyView) -> dict[str, Any]:
    """The parts of a reply a follower rebuilds it from (not its versions: pages add them)."""
    return {
        "run_id": reply.run_id,
        "status": reply.status,
        "text": reply.text,
        "reasoning": reply.reasoning,
        "tools": [asdict(card) for card in reply.tools],
        "error": reply.error,
        "live_run_id": reply.live_run_id,
        "cut_short": reply.cut_short,
        "cut_off": reply.cut_off,
        "model": reply.model,
        "usage": reply.usage.to_dict() if reply.usage is not None else None,
    }


async def publish_start(cluster: Cluster, state: RunState) -> None:
    """Write a run's first record (what a follower starts from) before anyone can ask
    another process for the run."""
    start = {
        "chat_id": state.chat_id,
        "input": state.input_text,
        "attachments": [asdict(a) for a in state.input_attachments],
        "continues": state.continues,
        "reply": reply_to_json(state.reply),
    }
    cluster.write(state.run_id, state.epoch, 0, "start", "", start)
    await cluster.flush()


def reply_from_json(data: dict[str, Any]) -> ReplyView:
    return ReplyView(
        str(data["run_id"]),
        data["status"],
        str(data["text"]),
        str(data["reasoning"]),
        [ToolCard(**card) for card in data["tools"]],
        data["error"],
        data["live_run_id"],
        bool(data["cut_short"]),
        cut_off=bool(data.get("cut_off")),  # absent from an older process's records
        model=data.get("model"),
        usage=Usage.from_dict(data["usage"]) if data.get("usage") else None,
    )


class Followers:
    """The runs this process follows, by run id."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._states: dict[str, RunState] = {}
        self._finished_at: dict[str, float] = {}
        self._pulling: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()

    async def follow(self, chat_id: str, run_id: str) -> RunState | None:
        """The run as its owner's latest attempt has written it; None if no attempt
        of it is in the database."""
        state = self._states.get(run_id)
        if state is None or state.abandoned:
            state = await self._load(run_id)
        return state if state is not None and state.chat_id == chat_id else None

    async def _load(self, run_id: str) -> RunState | None:
        epoch = await self.cluster.lease_epoch(run_id)
        if epoch is None:
            return None
        rows = await self.cluster.events(run_id, epoch, -1)
        found = self._states.get(run_id)  # another request loaded it meanwhile
        if found is not None and found.epoch == epoch and not found.abandoned:
            return found
        if not rows or rows[0].seq != 0 or rows[0].delta is None:
            return None
        start = rows[0].delta
        state = RunState(
            str(start["chat_id"]),
            run_id,
            epoch,
            str(start["input"]),
            reply_from_json(start["reply"]),
        )
        state.follower = True
        state.continues = start["continues"]
        state.input_attachments = tuple(
            Attachment.from_dict(a) for a in start.get("attachments", ())
        )
        self._apply(state, rows[1:])
        self._states[run_id] = state
        return state

    async def catch_up(self, state: RunState, seq: int, timeout: float = CATCH_UP_SECONDS) -> None:
        """Read ``state``'s events up to ``seq`` at least: a client that was reading the
        owner (or a quicker follower) may be ahead of this copy. Gives up after
        ``timeout`` (the client then gets a reset)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while state.seq < seq and not state.finished and loop.time() < deadline:
            await self._pull(state, check_lease=False)
            if state.seq < seq:
                await asyncio.sleep(0.02)  # the owner writes its events every 20 ms

    def drop(self, run_id: str) -> None:
        """This process resumed ``run_id`` itself: the copy of the attempt before ends,
        and its streams go on with this process's attempt at once."""
        state = self._states.pop(run_id, None)
        self._finished_at.pop(run_id, None)
        if state is not None and not state.finished:
            state.phase.abandon()
            state.append_nothing()

    def wake(self, run_id: str) -> None:
        """The owner wrote events of ``run_id`` ("*": of any run): read them (one read at
        a time per run)."""
        if run_id == "*":
            for each in list(self._states):
                self.wake(each)
            return
        state = self._states.get(run_id)
        if state is None or state.finished:
            return
        if run_id in self._pulling:
            self._again.add(run_id)
            return
        task = asyncio.get_running_loop().create_task(self._pull_woken(state))
        self._pulling[run_id] = task
        task.add_done_callback(lambda done: self._pulled(run_id, done))

    def _pulled(self, run_id: str, task: asyncio.Task[None]) -> None:
        self._pulling.pop(run_id, None)
        if not task.cancelled() and task.exception() is not None:  # the timer reads again
            logger.warning("run %s: could not read its events: %s", run_id, task.exception())
        if run_id in self._again:
            self._again.discard(run_id)
            self.wake(run_id)

    async def poll(self, now: float) -> None:
        """The timer: bring every unfinished follower up to date, drop old finished ones."""
        for run_id, state in list(self._states.items()):
            if not state.finished:
                try:
                    await self._pull(state, check_lease=True)
                except Exception:
                    logger.exception("run %s: could not read its events", run_id)
            elif now - self._finished_at.setdefault(run_id, now) > KEEP_FINISHED:
                self._states.pop(run_id, None)
                self._finished_at.pop(run_id, None)

    async def _pull_woken(self, state: RunState) -> None:
        """A notification's read. One that brings nothing of this attempt may be another
        attempt's start (a takeover elsewhere): then the lease says so at once, not at
        the next timer."""
        before = state.seq
        await self._pull(state, check_lease=False)
        if state.seq == before and not state.finished:
            await self._pull(state, check_lease=True)

    async def _pull(self, state: RunState, *, check_lease: bool) -> None:
        # The lease first: an owner writes its `done` record before it lets the lease
        # go, so a lease gone here means the events read next hold the end of the run.
        moved = check_lease and await self.cluster.lease_epoch(state.run_id) != state.epoch
        self._apply(state, await self.cluster.events(state.run_id, state.epoch, state.seq))
        if moved and not state.finished:
            state.phase.abandon()  # its readers reconnect to the next attempt
            state.append_nothing()

    def _apply(self, state: RunState, rows: list[EventRow]) -> None:
        for row in rows:
            if row.seq != state.seq + 1:
                continue  # read twice (a wake-up and the timer): already applied
            reply, delta = state.reply, row.delta or {}
            if row.event == TEXT:
                reply.text += delta.get("added", "")
            elif row.event == REASONING:
                reply.reasoning += delta.get("added", "")
            elif row.event == TOOL and "tool" in delta:
                card = ToolCard(**delta["tool"])
                found = reply.find_tool(card.call_id)
                if found is None:
                    reply.tools.append(card)
                else:
                    reply.tools[reply.tools.index(found)] = card
            elif row.event == DONE and "reply" in delta:
                state.reply = reply_from_json(delta["reply"])
            state.append(row.event, row.data)
            if row.event == DONE:
                state.phase.finish()
