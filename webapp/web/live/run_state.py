"""A run as the server shows it: its live reply and its numbered event log.

`RunState` is shared by the process that executes a run (`webapp.web.live.runs`)
and by processes that follow it from the database (`webapp.web.live.followers`):
the SSE stream (`webapp.web.sse`) reads either the same way.

Where a run is in its life is one value, its `Phase`: running, then finished
(its outcome durable, the ``done`` record in the log) or abandoned (ended
without a record: resumed by the next process to start, or another one), and
why it ends once something asked it to (a stop, its chat's deletion, its lease
lost). Each change is a method of the phase, which keeps the precedence: a
discard outranks a lost lease, which outranks a stop.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from webapp.events import Event, TerminalEvent
from webapp.runtime.agent import Agent
from webapp.runtime.run_handle import RunHandle
from webapp.transcript import Attachment, Entry, UserEntry
from webapp.web.live.reply import ReplyView

# What a log record says changed: its SSE event name too (webapp.web.event_names).
TEXT = "text"  # text appended to the reply
REASONING = "reasoning"  # reasoning appended to the reply
TOOL = "tool"  # a tool card started, or finished
DONE = "done"  # the final reply: the run's outcome is durable


class Stage(enum.Enum):
    RUNNING = "running"
    FINISHED = "finished"  # the outcome is durable and the `done` record is in the log
    ABANDONED = "abandoned"  # ended with no record: the checkpoint resumes it elsewhere


class Ending(enum.Enum):
    """Why a run ends, once something asked it to."""

    STOP = "stop"  # the user's Stop (here, or asked by another process)
    LEASE_LOST = "lease lost"  # another process may have taken it over: record nothing
    DISCARD = "discard"  # its chat is being deleted: record nothing


_OUTRANKS = {None: 0, Ending.STOP: 1, Ending.LEASE_LOST: 2, Ending.DISCARD: 3}


@dataclass
class Phase:
    """A run's place in its life (`Stage`) and why it ends (`Ending`), changed only
    through these methods."""

    stage: Stage = Stage.RUNNING
    ending: Ending | None = None

    def end_for(self, why: Ending) -> None:
        """Something asks the run to end; a weightier reason stays."""
        if _OUTRANKS[why] > _OUTRANKS[self.ending]:
            self.ending = why

    def finish(self) -> None:
        self.stage = Stage.FINISHED

    def abandon(self) -> None:
        self.stage = Stage.ABANDONED


class LogRecord(NamedTuple):
    """One event of a run's log. A named tuple, not a frozen dataclass: a run
    appends one per token, and a tuple is about three times cheaper to build."""

    seq: int  # 1-based position in the run's log
    event: str  # SSE event name (webapp.web.event_names)
    data: str  # HTML fragment htmx swaps as is


@dataclass
class RunState:
    """A run as the server shows it: the live reply plus its event log.

    Readers wait in `wait_beyond`; an append wakes them at once, and the
    appends after it in the same turn of the event loop find nobody waiting
    (the woken readers run in the next turn and read all of them), so a burst
    costs each reader one wake-up -- and the first record is not a turn late.
    """

    chat_id: str
    run_id: str
    epoch: str  # this process + this attempt: positions of another epoch are stale
    input_text: str
    reply: ReplyView
    records: list[LogRecord] = field(default_factory=list)
    handle: RunHandle | None = None
    agent: Agent | None = None  # the chat's agent for this attempt (None: the app's default)
    terminal: asyncio.Future[TerminalEvent] = field(init=False)
    phase: Phase = field(default_factory=Phase)
    follower: bool = False  # executed by another process; this copy is read from the database
    continues: str | None = None  # the reply (run id) this continuation goes on with
    from_input: bool = False  # restarted from its input: it never saved a checkpoint
    # The kinds (TEXT, REASONING) whose next delta starts a new model turn.
    new_turn: set[str] = field(default_factory=lambda: {TEXT, REASONING})
    input_attachments: tuple[Attachment, ...] = ()  # the files its message brought (§14)
    # Deltas the run emitted since the log's last record, recorded together at the end
    # of this turn of the event loop (`Recorder.take`).
    unrecorded: list[Event] = field(default_factory=list, init=False, repr=False)
    _waiters: set[asyncio.Future[None]] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self.terminal = asyncio.get_running_loop().create_future()

    @property
    def finished(self) -> bool:
        """It ended: its outcome is durable (or, abandoned, it records nothing here)."""
        return self.phase.stage is not Stage.RUNNING

    @property
    def abandoned(self) -> bool:
        return self.phase.stage is Stage.ABANDONED

    @property
    def stop_requested(self) -> bool:
        return self.phase.ending is Ending.STOP

    @property
    def lease_lost(self) -> bool:
        return self.phase.ending is Ending.LEASE_LOST

    @property
    def discarded(self) -> bool:
        return self.phase.ending is Ending.DISCARD

    @property
    def paused(self) -> bool:
        """It waits for a tool approval: nothing runs it, and its reply is read from the
        database (`webapp.web.live.pauses`), where a decision may have changed it."""
        return self.finished and self.reply.status == "waiting"

    @property
    def seq(self) -> int:
        return len(self.records)

    @property
    def position(self) -> str:
        """The SSE position ("EPOCH:SEQ") of the reply as it is right now."""
        return f"{self.epoch}:{self.seq}"

    def append(self, event: str, data: str) -> None:
        records = self.records
        records.append(LogRecord(len(records) + 1, event, data))
        if self._waiters:
            self._wake()

    def append_nothing(self) -> None:
        """Wake the readers without a new record (the run ended without one)."""
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_beyond(self, seq: int, timeout: float) -> None:
        """Return once the log is longer than ``seq`` (or the run finished, or timeout)."""
        if self.seq > seq or self.finished:
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.add(waiter)
        timer = loop.call_later(timeout, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiters.discard(waiter)  # still there after a timeout or a cancel


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def run_input(state: RunState) -> str | list[Entry]:
    """What a run starts from: the user's text, with the files it brought (SPEC §14)."""
    if state.input_attachments:
        return [UserEntry(state.input_text, state.input_attachments)]
    return state.input_text
