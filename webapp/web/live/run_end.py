"""A run always ends (SPEC §17): what `RunManager` does when recording an outcome fails.

Recording a run's outcome is a database write; a database that is busy, full or
briefly gone makes it fail. Before this module such a run kept its chat's
``active_run_id`` until a restart -- every later Send in that chat answered 409
-- and the restart replayed it into the same failure. Now:
- a database error is retried a few times (`retried`), with a short pause;
- if the outcome still cannot be recorded, the chat is released
  (`ChatStore.release_run`, itself retried): its run marked failed with the
  reason, so the user can go on;
- only if even that fails is the chat left to the next start's recovery, and
  the log says so.

`RunObserver` is what the metrics (`webapp.web.metrics`) learn of runs: the
manager calls it as runs start and end, and on a database error.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import asyncpg

from webapp.usage import Usage

logger = logging.getLogger("webapp.web.live.runs")

T = TypeVar("T")

ATTEMPTS = 3
PAUSE = 0.2  # seconds before the second attempt; doubled before each next one


class RunObserver(Protocol):
    """What is told of runs as they start and end (the metrics)."""

    def run_started(self) -> None: ...

    def run_ended(self, status: str, usage: Usage | None) -> None: ...

    def database_error(self) -> None: ...


class NoObserver:
    """Nobody watches: every call is a no-op."""

    def run_started(self) -> None:
        pass

    def run_ended(self, status: str, usage: Usage | None) -> None:
        pass

    def database_error(self) -> None:
        pass


def is_database_error(exc: BaseException) -> bool:
    """An error of the database or of the connection to it: worth another attempt."""
    return isinstance(exc, sqlite3.Error | asyncpg.PostgresError | asyncpg.InterfaceError | OSError)


async def retried(
    attempt: Callable[[], Awaitable[T]],
    what: str,
    observer: RunObserver,
    *,
    attempts: int = ATTEMPTS,
    pause: float = PAUSE,
) -> T:
    """``attempt()``, tried again after a database error (``attempts`` in all); any other
    error, or the last database error, is raised."""
    for number in range(1, attempts + 1):
        try:
            return await attempt()
        except Exception as exc:
            if not is_database_error(exc):
                raise
            observer.database_error()
            if number == attempts:
                raise
            logger.warning(
                "%s failed (%s); trying again (%d of %d)", what, exc, number + 1, attempts
            )
            await asyncio.sleep(pause * 2 ** (number - 1))
    raise AssertionError("unreachable")  # pragma: no cover
