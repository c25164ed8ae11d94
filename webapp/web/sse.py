"""Server-Sent Events: a run's log as an event stream, resumable from any position.

Every event's data is an HTML fragment htmx swaps as is, and every event id is
a position "EPOCH:SEQ" in the run's log. A client resumes from the
``Last-Event-ID`` header (the browser's own reconnect) or, on a fresh
connection, from the ``after`` query parameter the page rendered. EPOCH names
this server process and run attempt, so a position from before a restart is
recognised as stale: the client gets one ``reset`` event that replaces the
whole reply with its current state, whose own ``sse-connect`` continues from
there.

Deliberate divergences from a plain event stream:
1. A slow client is never given its own queue: it reads the shared log by
   index, and consecutive text deltas it is behind on are coalesced into one
   event, so memory per client is constant.
2. A finished run's stream ends after its ``done`` event, whose fragment is
   the final rendered reply; the page closes the EventSource on it
   (``sse-close``). A reconnect to a finished run with nothing left to send
   gets 204, which tells the browser not to reconnect again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from sse_starlette import ServerSentEvent

from webapp.web.event_names import COALESCED, DONE, RESET
from webapp.web.runs import LogRecord, RunManager, RunState

logger = logging.getLogger("webapp.web.sse")

MAX_COALESCE = 512  # records per event, so one event stays a reasonable size
RETRY_MS = 1000  # how soon a browser reconnects after a dropped stream
PING_SECONDS = 15
WAIT_SECONDS = 10.0
BATCH_WINDOW = 0.03  # seconds a woken stream waits so deltas arrive as one event
SEND_TIMEOUT = 30.0  # a client that takes no data for this long is dropped


def parse_position(position: str | None) -> tuple[str | None, int]:
    """("EPOCH", SEQ) from "EPOCH:SEQ"; anything malformed is (None, 0): a stale position."""
    if not position:
        return None, 0
    epoch, sep, seq = position.rpartition(":")
    # isascii() too: str.isdigit() accepts "³" and "①", which int() then rejects.
    if not sep or not epoch or not (seq.isascii() and seq.isdigit()) or len(seq) > 12:
        return None, 0
    return epoch, int(seq)


def coalesce(records: list[LogRecord], start: int) -> list[tuple[str, str, int]]:
    """Events to send for ``records[start:]``: (event name, data, seq of its last record)."""
    out: list[tuple[str, str, int]] = []
    index = start
    while index < len(records):
        record = records[index]
        parts = [record.data]
        index += 1
        if record.event in COALESCED:
            while (
                index < len(records)
                and records[index].event == record.event
                and len(parts) < MAX_COALESCE
            ):
                parts.append(records[index].data)
                index += 1
        out.append((record.event, "".join(parts), records[index - 1].seq))
    return out


async def once(event: str, html: str) -> AsyncIterator[ServerSentEvent]:
    yield ServerSentEvent(html, event=event, retry=RETRY_MS)


async def stream(
    runs: RunManager, state: RunState, epoch: str | None, seq: int
) -> AsyncIterator[ServerSentEvent]:
    """The run's log from position (``epoch``, ``seq``); a stale position gets a reset."""
    try:
        if epoch != state.epoch or seq > state.seq:
            # Synchronous from here to the yield: the fragment is the reply at this position.
            position = state.position
            html = runs.reply_html(state)
            yield ServerSentEvent(html, event=RESET, id=position, retry=RETRY_MS)
            return
        first = True
        while True:
            if state.seq > seq:
                for event, data, last in coalesce(state.records, seq):
                    yield ServerSentEvent(
                        data,
                        event=event,
                        id=f"{state.epoch}:{last}",
                        retry=RETRY_MS if first else None,
                    )
                    first = False
                    seq = last
                    if event == DONE:
                        return
                continue
            if state.finished:
                return  # an abandoned run (shutdown): the client reconnects elsewhere
            await state.wait_beyond(seq, WAIT_SECONDS)
            # Let a few more deltas arrive: one event per window instead of one per
            # token keeps the per-client cost flat however fast the model streams.
            await asyncio.sleep(BATCH_WINDOW)
    except asyncio.CancelledError:
        logger.debug("client left run %s at %s", state.run_id, seq)
        raise
