"""The cluster of one process: every run is this process's, and nobody else reads its log.

`LocalCluster` is the `webapp.stores.cluster.Cluster` the app runs with when it is
the only process (a SQLite file; `webapp.stores.postgres_cluster` is the one of
several processes). Each operation is what agreeing with nobody amounts to: a
claim always succeeds, a lease is never lost, a chat's lock is only this
process's own (`webapp.web.live.chat_locks`), a write is never fenced off, a
run's records stay in its `RunState`, and the runs still owed after a restart
are those the chat database names, less the ones waiting for a tool approval.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from webapp.chats.store import ChatStore
from webapp.stores.cluster import EventRow, LeaseTimes


def _ignore(*args: object) -> None:
    return None


class LocalCluster:
    """One process, alone: see the module docstring."""

    def __init__(self, store: ChatStore, owner: str | None = None) -> None:
        self.store = store
        self.owner = owner or uuid.uuid4().hex[:8]
        self.lease = LeaseTimes()  # never renewed: nobody could take a run over
        self.on_events: Callable[[str], None] = _ignore
        self.on_stop: Callable[[str], None] = _ignore
        self.on_handover: Callable[[], None] = _ignore

    def __repr__(self) -> str:
        return f"LocalCluster(owner={self.owner!r})"

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def keep_listening(self) -> None:
        return None

    @contextlib.asynccontextmanager
    async def chat_lock(self, key: str) -> AsyncIterator[None]:
        yield  # the caller holds this process's own lock: there is no other process

    def fenced(self, run_id: str, epoch: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    async def claim(self, run_id: str, chat_id: str, epoch: str) -> bool:
        return True

    async def renew(self, attempts: Mapping[str, str]) -> tuple[set[str], set[str]]:
        return set(attempts), set()

    async def release(self, run_id: str, epoch: str) -> None:
        return None

    async def hand_over(self) -> int:
        return 0

    async def unowned(self) -> list[tuple[str, str]]:
        """The runs the chat database says are owed, but for those waiting for the user."""
        chats = await self.store.with_active_run()
        waiting = await self.store.approvals.paused() if chats else set()
        return [
            (c.id, c.active_run_id)
            for c in chats
            if c.active_run_id is not None and c.active_run_id not in waiting
        ]

    async def lease_epoch(self, run_id: str) -> str | None:
        return None  # no other process executes anything

    async def request_stop(self, run_id: str) -> None:
        return None

    def write(
        self, run_id: str, epoch: str, seq: int, event: str, data: str, delta: dict[str, Any]
    ) -> None:
        return None  # the run's own RunState holds its log

    async def flush(self) -> None:
        return None

    async def events(self, run_id: str, epoch: str, after: int) -> list[EventRow]:
        return []

    async def forget_old_events(self) -> None:
        return None
