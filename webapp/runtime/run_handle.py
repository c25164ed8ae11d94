"""`RunHandle`: a run in progress, as the caller of `Runner.stream` holds it."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, cast

from webapp.events import TERMINAL_EVENTS, Event, RunCancelled, RunFailed, TerminalEvent

if TYPE_CHECKING:
    from webapp.runtime.result import RunResult


class Executable(Protocol):
    """What a handle drives: the run loop (`webapp.runtime.runner`)."""

    run_id: str
    emit: Callable[[Event], None]
    terminal_sent: bool

    def execute(self) -> Coroutine[Any, Any, RunResult]: ...


class RunHandle:
    """A run in progress: an async iterator of events, ``result()`` and ``cancel()``.

    Iterating never raises: a failure arrives as `RunFailed`, a cancel as
    `RunCancelled`, each exactly once and last.
    """

    def __init__(self, run: Executable) -> None:
        self.run_id = run.run_id
        self._due: deque[Event] = deque()  # not an asyncio.Queue: cheaper, once per token
        self._arrived: asyncio.Future[None] | None = None  # the one iterator waiting
        self._sink: Callable[[Event], None] | None = None  # `events_to`'s
        self._finished = False
        self._cancel_requested = False
        self._run = run
        run.emit = self._emit
        self._task = asyncio.get_running_loop().create_task(run.execute(), name=f"run-{run.run_id}")
        self._task.add_done_callback(self._ensure_terminal)

    def _emit(self, event: Event) -> None:
        if isinstance(event, TERMINAL_EVENTS):
            self._run.terminal_sent = True
        elif self._sink is not None:
            self._sink(event)
            return
        self._due.append(event)
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)

    def _ensure_terminal(self, task: asyncio.Task[RunResult]) -> None:
        # Retrieved here, whoever awaits the result: the failure reaches the caller as
        # RunFailed, and asyncio would otherwise log it, unredacted, when the task goes.
        error = None if task.cancelled() else task.exception()
        if self._run.terminal_sent:
            return
        # A task cancelled before its first step never runs its own handlers.
        if task.cancelled():
            self._emit(RunCancelled([]))
        elif error is not None:
            self._emit(RunFailed(error, []))  # type: ignore[arg-type]

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        while not self._finished:
            while not self._due:
                self._arrived = asyncio.get_running_loop().create_future()
                await self._arrived
            event = self._due.popleft()
            if isinstance(event, TERMINAL_EVENTS):
                self._finished = True
            yield event

    async def events_to(self, sink: Callable[[Event], None]) -> TerminalEvent:
        """Instead of iterating: hand each event to ``sink`` as the run emits it, and
        return the terminal event (which ``sink`` does not get) once it comes.

        ``sink`` runs in the run's own task, between one model part and the next, so
        no task is woken per token to take it (`webapp.web.live` records a run this
        way). It must not block; an exception from it fails the run, which then ends
        with `RunFailed`. Events emitted before the call go to ``sink`` first.
        """
        due = self._due
        while due and not isinstance(due[0], TERMINAL_EVENTS):
            sink(due.popleft())
        self._sink = sink
        while not due:
            self._arrived = asyncio.get_running_loop().create_future()
            await self._arrived
        self._finished, self._sink = True, None  # the sink may hold its reader: let go
        return cast(TerminalEvent, due.popleft())  # only a terminal is queued with a sink

    def cancel(self) -> None:
        """Stop the run: interrupts the model stream or the running tool at once."""
        if not self._cancel_requested and not self._task.done():
            self._cancel_requested = True
            self._task.cancel()

    @property
    def done(self) -> bool:
        return self._task.done()

    async def result(self) -> RunResult:
        """The result; raises the run's exception, or CancelledError after a cancel."""
        return await asyncio.shield(self._task)
