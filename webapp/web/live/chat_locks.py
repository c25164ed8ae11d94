"""Per-chat asyncio locks that exist only while someone holds or waits for one.

A lock kept for every chat ever touched grows with the chats a process has seen
(100,000 chats, 100,000 locks, for as long as it runs). Here a chat's entry
counts its users -- the holder and the waiters -- and goes with the last of
them. It is never dropped while anyone waits: a newcomer would get a fresh lock
and run beside the holder, which is the interleaving the lock exists to prevent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0  # holding or waiting


class ChatLocks:
    """One asyncio lock per key, created on first use and dropped when unused."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        """How many keys are held or waited for right now."""
        return len(self._entries)

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold ``key``'s lock for the block (waiting for it first if need be)."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.users += 1  # counted before the wait: a waiter keeps the entry alive
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users:
                del self._entries[key]
