"""Who executes a run, and how other processes see it: one interface, two implementations.

Live runs (`webapp.web.live`) ask a `Cluster` for everything that differs between
one process and several:

- `webapp.stores.postgres_cluster.PostgresCluster`: several processes on one
  PostgreSQL database agree through leases, fencing, an event log and wake-ups;
- `webapp.web.live.local_cluster.LocalCluster`: one process (SQLite, or a single
  process on PostgreSQL) owns every run; there is nobody to agree with, so a
  claim always succeeds, a lock is only this process's own, a write is never
  fenced off and no event needs to leave the process.

So the code of a run has one path, whichever back end runs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

LEASE_SECONDS = 10.0  # a lease not renewed for this long is another process's to take


@dataclass(frozen=True)
class LeaseTimes:
    """How long a lease lasts unrenewed (``seconds``, the ``--lease-seconds`` setting),
    and how often it is renewed: a fifth of that, so a renewal may fail twice and the
    lease still holds."""

    seconds: float = LEASE_SECONDS

    def __post_init__(self) -> None:
        if not self.seconds >= 1.0:
            raise ValueError(f"a lease lasts at least 1 second, got {self.seconds!r}")

    @property
    def renew(self) -> float:
        """Seconds between renewals, scans for runs nobody owns, and followers' polls."""
        return self.seconds / 5


@dataclass(frozen=True)
class EventRow:
    """One record of a run's log as another process wrote it."""

    seq: int
    event: str
    data: str
    delta: dict[str, Any] | None


class Cluster(Protocol):
    """This process's view of the others: its leases, its event writes, its wake-ups.

    The callbacks run on this process's loop when another process writes events
    (``on_events(run_id)``), asks for a stop (``on_stop(run_id)``) or hands runs
    over (``on_handover()``).
    """

    owner: str
    lease: LeaseTimes
    on_events: Callable[[str], None]
    on_stop: Callable[[str], None]
    on_handover: Callable[[], None]

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def keep_listening(self) -> None: ...

    def chat_lock(self, key: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold ``key``'s lock against other processes for the block."""
        ...

    def fenced(self, run_id: str, epoch: str) -> contextlib.AbstractContextManager[None]:
        """Each write in the block (and in tasks it starts) is refused with
        `FencedOffError` once attempt ``epoch`` no longer holds the run's lease."""
        ...

    async def claim(self, run_id: str, chat_id: str, epoch: str) -> bool:
        """Take the lease on ``run_id`` if nobody holds a live one; True if this process has it."""
        ...

    async def renew(self, attempts: Mapping[str, str]) -> tuple[set[str], set[str]]:
        """Extend the leases on ``attempts`` (run id -> epoch); returns the run ids
        (still held, stop requested)."""
        ...

    async def release(self, run_id: str, epoch: str) -> None: ...

    async def hand_over(self) -> int:
        """Give up every lease of this process at once; returns how many."""
        ...

    async def unowned(self) -> list[tuple[str, str]]:
        """(chat id, run id) of runs still owed that no live process executes (not
        those waiting for a tool approval)."""
        ...

    async def lease_epoch(self, run_id: str) -> str | None:
        """The epoch of the attempt that holds ``run_id``'s lease (None: no process's)."""
        ...

    async def request_stop(self, run_id: str) -> None: ...

    def write(
        self, run_id: str, epoch: str, seq: int, event: str, data: str, delta: dict[str, Any]
    ) -> None:
        """Queue one record of a run's log for the other processes."""
        ...

    async def flush(self) -> None:
        """Return once every record queued so far is written."""
        ...

    async def events(self, run_id: str, epoch: str, after: int) -> list[EventRow]: ...

    async def forget_old_events(self) -> None: ...
