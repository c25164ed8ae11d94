"""A model's stream, paced: parts already buffered never hold the event loop.

A model faster than this loop (a burst that arrived at once, or a local server
on the same machine) hands over part after part without ever waiting, and a
run reading them would keep the event loop from every other chat and request.
`paced` hands the loop back once parts have kept it for a slice of time: 5 ms,
or 1 ms in a turn's first 25 ms, so the send's answer and the event stream's
request get through before the rest of a burst is read. A part that took a
while to arrive came after the loop had its turns, and starts a new slice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")

SLICE = 0.005  # seconds a model's buffered parts may keep the event loop to themselves
OPENING = 0.025  # seconds from a turn's start in which the slice is shorter...
OPENING_SLICE = 0.001  # ...so the send's answer and the event stream's request get through
WAITED = 0.001  # a part that took this long to arrive came after the loop had turns


async def paced(parts: AsyncIterator[T]) -> AsyncIterator[T]:
    """``parts`` as they come, with the loop handed back every slice of busy time."""
    started = busy_since = ready_at = time.perf_counter()
    async for part in parts:
        now = time.perf_counter()
        slice_ = SLICE if now - started > OPENING else OPENING_SLICE
        if now - ready_at > WAITED:
            busy_since = now  # the stream waited for the model: others had their turn
        elif now - busy_since > slice_:
            await asyncio.sleep(0)
            busy_since = time.perf_counter()
        yield part
        ready_at = time.perf_counter()
