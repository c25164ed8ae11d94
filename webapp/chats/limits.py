"""Per-person limits on starting replies (SPEC §13), decided where a run is recorded.

`admit` runs inside `ChatStore.begin_run`'s transaction, before anything is
written: a send over a limit raises `LimitReached` and the transaction
writes nothing (no message, no version, no client id). Both counts come from
the database, so they hold across any number of processes:
- **replies running at once**: the owner's chats with a run in flight. On
  PostgreSQL two processes could otherwise both count one short of the limit
  and both start; a transaction lock per owner makes the second count after
  the first has committed.
- **tokens per day**: the usage of the owner's runs that finished since
  00:00 UTC, from the per-run columns ``chat_runs.tokens_in``,
  ``tokens_out`` and ``finished_at`` (SPEC §12's usage, written as each run
  ends). The limit is checked before a run starts, so the run that crosses it
  finishes; the next one is refused. Usage of a deleted chat goes with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from webapp.chats.db import Tx
from webapp.chats.users import Owner

DAY = 86400.0
LimitKind = Literal["runs", "tokens"]


@dataclass(frozen=True)
class Limits:
    """None: no limit."""

    max_runs: int | None = None  # replies running at once, per person
    max_tokens_per_day: int | None = None  # tokens in + out per person per UTC day

    @property
    def any(self) -> bool:
        return self.max_runs is not None or self.max_tokens_per_day is not None

    def __post_init__(self) -> None:
        for name, value in (("max_runs", self.max_runs), ("max_tokens", self.max_tokens_per_day)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or None for no limit), got {value}")


class LimitReached(Exception):
    """Starting this run would go over a limit; nothing was written."""

    def __init__(self, kind: LimitKind, limit: int, used: int, resets_at: float | None) -> None:
        super().__init__(f"{kind} limit {limit} reached ({used} used)")
        self.kind = kind
        self.limit = limit
        self.used = used
        self.resets_at = resets_at  # tokens: the next 00:00 UTC; runs: when one ends (None)


async def admit(tx: Tx, limits: Limits, owner: Owner, chat_id: str, now: float) -> None:
    """Raise `LimitReached` if ``owner`` may not start another run now."""
    if not limits.any:
        return
    if tx.dialect == "postgresql":
        await tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('webapp.limits'), hashtext(?))",
            (owner.user_id or "",),
        )
    if limits.max_runs is not None:
        where, params = owner.condition()
        rows = await tx.fetch(
            "SELECT COUNT(*) FROM chats WHERE active_run_id IS NOT NULL AND id <> ?" + where,
            (chat_id, *params),
        )
        running = int(rows[0][0])
        if running >= limits.max_runs:
            raise LimitReached("runs", limits.max_runs, running, None)
    if limits.max_tokens_per_day is not None:
        today = now - now % DAY
        where, params = owner.condition("c.user_id")
        rows = await tx.fetch(
            # Summed as floats: 64-bit integers overflow on a few huge figures.
            "SELECT COALESCE(SUM(CAST(COALESCE(r.tokens_in, 0) AS DOUBLE PRECISION) "
            "+ CAST(COALESCE(r.tokens_out, 0) AS DOUBLE PRECISION)), 0) "
            "FROM chat_runs r JOIN chats c ON c.id = r.chat_id WHERE r.finished_at >= ?" + where,
            (today, *params),
        )
        used = int(rows[0][0])
        if used >= limits.max_tokens_per_day:
            raise LimitReached("tokens", limits.max_tokens_per_day, used, today + DAY)
