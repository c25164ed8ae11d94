"""Token usage, summed over model calls.

Usage figures come from remote parties (an endpoint's ``usage``, an imported
file), so each is checked once, where it enters (`reported_count`): a
non-negative integer below 2^53 (a bool is not a count), or it is ignored.
A figure past that made the database's 64-bit integers overflow and left the
chat that recorded it locked. Sums saturate at `MAX_TOKENS` for the same
reason: no number of model calls or continuations can carry a run past it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("webapp.usage")

TOKENS_LIMIT = 2**53  # a count must be below this (exact as a float, in JSON and in SQL)
MAX_TOKENS = TOKENS_LIMIT - 1


def reported_count(value: object, what: str) -> int | None:
    """``value`` as a token count, or None (logged) when it is not a sane one."""
    if value is None:
        return None
    if type(value) is int and 0 <= value < TOKENS_LIMIT:
        return value
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:40] + "..."
    logger.warning(
        "ignored a usage figure %s = %s: not a whole number from 0 below 2^53", what, shown
    )
    return None


def _saturated(value: int) -> int:
    return min(max(value, 0), MAX_TOKENS)


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=_saturated(self.input_tokens + other.input_tokens),
            output_tokens=_saturated(self.output_tokens + other.output_tokens),
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Usage:
        """Usage as `to_dict` wrote it; a count that is not a sane one counts as 0."""
        data = data or {}
        return cls(
            input_tokens=reported_count(data.get("input_tokens", 0), "input_tokens") or 0,
            output_tokens=reported_count(data.get("output_tokens", 0), "output_tokens") or 0,
        )
