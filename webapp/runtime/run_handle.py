"""`RunHandle`: a run in progress, as the caller of `Runner.stream` holds it."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from webapp.events import TERMINAL_EVENTS, Event, RunCancelled, RunFailed

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
        self._finished = False
        self._cancel_requested = False
        self._run = run
        run.emit = self._emit
        self._task = asyncio.get_running_loop().create_task(run.execute(), name=f"run-{run.run_id}")
        self._task.add_done_callback(self._ensure_terminal)

    def _emit(self, event: Event) -> None:
        if isinstance(event, TERMINAL_EVENTS):
            self._run.terminal_sent = True
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

    async def batches(self) -> AsyncIterator[list[Event]]:
        """The same events, each time all that are due at once, in order.

        A consumer that wakes after a burst of tokens takes them in one go, so
        its per-token work can be done once per wake-up (`webapp.web.live`).
        """
        due = self._due
        while not self._finished:
            while not due:
                self._arrived = asyncio.get_running_loop().create_future()
                await self._arrived
            batch = list(due)
            due.clear()
            for i, event in enumerate(batch):
                if isinstance(event, TERMINAL_EVENTS):  # always the last one emitted
                    self._finished = True
                    del batch[i + 1 :]
                    break
            yield batch

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
