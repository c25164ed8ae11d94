"""How one process's PostgreSQL connections are shared out (``--db-pool-size``, SPEC §17).

A process on PostgreSQL keeps six kinds of connections: the chat tables', the
sessions', the checkpoints', the run events' (`webapp.web.live.cluster`), the
chat locks' and one that listens for notifications. Each had a pool of its own
with a fixed size -- 43 connections per process, none configurable, so a few
processes used up a server's default ``max_connections`` of 100. Now one
number is the most the process opens, shared by `shares`.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_POOL_SIZE = 20
MIN_POOL_SIZE = 6  # one connection of each kind

# How the connections beyond one of each are shared: most for the chat tables.
_WEIGHTS = {"chats": 3, "session": 2, "checkpoints": 2, "locks": 2, "events": 1}


@dataclass(frozen=True)
class PoolShares:
    chats: int
    session: int
    checkpoints: int
    events: int
    locks: int
    listener: int = 1

    @property
    def total(self) -> int:
        return self.chats + self.session + self.checkpoints + self.events + self.locks + 1


def shares(total: int = DEFAULT_POOL_SIZE) -> PoolShares:
    """``total`` connections shared out; `ValueError` below `MIN_POOL_SIZE`."""
    if isinstance(total, bool) or not isinstance(total, int) or total < MIN_POOL_SIZE:
        raise ValueError(
            f"the database pool size must be at least {MIN_POOL_SIZE} (one connection for "
            f"each of the chats, sessions, checkpoints, run events, chat locks and "
            f"notifications), got {total!r}"
        )
    spare = total - MIN_POOL_SIZE
    weight = sum(_WEIGHTS.values())
    sizes = {name: 1 + spare * w // weight for name, w in _WEIGHTS.items()}
    sizes["chats"] += total - 1 - sum(sizes.values())  # what rounding left over
    return PoolShares(**sizes)
