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
   At most one batch goes out per ``BATCH_WINDOW``; the first after a quiet
   spell (a reply's first token above all) goes at once.
2. A finished run's stream ends after its ``done`` event, whose fragment is
   the final rendered reply; the page closes the EventSource on it
   (``sse-close``). A reconnect to a finished run with nothing left to send
   gets 204, which tells the browser not to reconnect again.
3. At a model's pace there is one event per token per client, so events are
   encoded here (`encode`, the stream format's fields in one f-string) and
   handed to sse-starlette's ``EventSourceResponse`` as bytes, which it sends
   unchanged. Its own ``ping`` is off: the stream says when it has been quiet
   (a ``ping`` comment, `PING_SECONDS`), so a busy stream sends none and a
   connection has no timer task of its own. Client disconnects, stuck clients
   (``send_timeout``), ``HEAD`` (headers, no body) and server shutdown are
   sse-starlette's.
4. At a graceful shutdown sse-starlette sets the stream's ``shutdown_event``
   (it watches uvicorn's exit, however the server was started); the stream
   then ends after the event it is sending, as a clean end of body rather
   than a cut connection, within `SHUTDOWN_GRACE`. The browser reconnects at
   once -- to whichever process serves next.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import AsyncIterator

import anyio
from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.types import Receive, Scope, Send

from webapp.web.event_names import COALESCED, DONE, RESET
from webapp.web.live.run_state import LogRecord, RunState
from webapp.web.live.runs import RunManager

logger = logging.getLogger("webapp.web.sse")

MAX_COALESCE = 512  # records per event, so one event stays a reasonable size
RETRY_MS = 1000  # how soon a browser reconnects after a dropped stream
PING_SECONDS = 15.0  # a quiet stream sends a comment this often, so proxies keep it open
PING = b": ping\r\n\r\n"
BATCH_WINDOW = 0.03  # seconds: a stream sends at most one batch of deltas per window
SEND_TIMEOUT = 30.0  # a client that takes no data for this long is dropped
SHUTDOWN_GRACE = 1.0  # seconds a stream has to end by itself at shutdown before it is cut
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # each line of data gets its own "data:" field


def encode(event: str, data: str, event_id: str, retry: int | None = None) -> bytes:
    """One event in the stream format: its fields, CRLF line ends, one ``data:`` per line."""
    if "\n" in data or "\r" in data:
        data = "\r\ndata: ".join(_LINE_BREAK.split(data))
    if retry is None:
        return f"id: {event_id}\r\nevent: {event}\r\ndata: {data}\r\n\r\n".encode()
    return f"id: {event_id}\r\nevent: {event}\r\ndata: {data}\r\nretry: {retry}\r\n\r\n".encode()


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


class RunStream:
    """sse-starlette's response, with a client dropped for not reading logged as routine.

    A wrapper, not a subclass: the response is the library's own, built by its
    public constructor; this only catches the error it raises by design.
    """

    def __init__(self, response: EventSourceResponse) -> None:
        self.response = response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
        except SendTimeoutError:
            # sse-starlette has closed the stream's iterator; the socket is full, so
            # the response cannot be ended cleanly either: uvicorn closes it.
            logger.info("dropped a client that took no data for %g s", SEND_TIMEOUT)


def response(events: AsyncIterator[bytes], shutdown: anyio.Event | None = None) -> RunStream:
    """The stream ``events`` (encoded here) as sse-starlette sends it (divergences 3, 4)."""
    return RunStream(
        EventSourceResponse(
            events,
            ping=0,  # the stream sends its own, when quiet
            send_timeout=SEND_TIMEOUT,
            shutdown_event=shutdown,
            shutdown_grace_period=SHUTDOWN_GRACE if shutdown is not None else 0,
        )
    )


async def once(event: str, html: str) -> AsyncIterator[bytes]:
    """One event with no id (a stored reply is no position in a live log)."""
    yield encode(event, html, "", RETRY_MS).removeprefix(b"id: \r\n")


async def stream(
    runs: RunManager,
    state: RunState,
    epoch: str | None,
    seq: int,
    shutdown: anyio.Event | None = None,
) -> AsyncIterator[bytes]:
    """The run's log from position (``epoch``, ``seq``); a stale position gets a reset.

    Ends, cleanly, once ``shutdown`` is set (sse-starlette sets it: divergence 4).
    """
    ending = shutdown if shutdown is not None else anyio.Event()  # never set: no shutdown
    waker: asyncio.Task[None] | None = None
    runs.readers.came(state)  # its live state stays while it is read
    try:
        if epoch != state.epoch or seq > state.seq:
            # Synchronous from here to the yield: the fragment is the reply at this position.
            position = state.position
            html = runs.reply_html(state)
            yield encode(RESET, html, position, RETRY_MS)
            return
        loop = asyncio.get_running_loop()
        if shutdown is not None:
            waker = loop.create_task(_wake_at(shutdown, state))
        first = True
        sent_at = -math.inf  # when the last batch was taken from the log
        while not ending.is_set():
            if state.seq > seq:
                # At most one batch per window: deltas that arrive meanwhile go out as
                # one event, which keeps the per-client cost flat however fast the
                # model streams. The first batch after a quiet spell (the reply's
                # first token above all) goes at once.
                wait = sent_at + BATCH_WINDOW - loop.time()
                if wait > 0 and not state.finished:
                    await asyncio.sleep(wait)
                sent_at = loop.time()
                for event, data, last in coalesce(state.records, seq):
                    yield encode(event, data, f"{state.epoch}:{last}", RETRY_MS if first else None)
                    first = False
                    seq = last
                    if event == DONE:
                        return
                continue
            if state.finished:
                # An abandoned attempt: if this process now shows the run's next one (it
                # took the run over), the client gets it at once; else it reconnects.
                newer = await _next_attempt(runs, state)
                if newer is not None:
                    position = newer.position  # synchronous from here to the yield
                    yield encode(RESET, runs.reply_html(newer), position, RETRY_MS)
                return
            await state.wait_beyond(seq, PING_SECONDS)
            if state.seq == seq and not state.finished and not ending.is_set():
                yield PING
    except asyncio.CancelledError:
        logger.debug("client left run %s at %s", state.run_id, seq)
        raise
    finally:
        runs.readers.left(state)
        if waker is not None:
            waker.cancel()


async def _next_attempt(runs: RunManager, state: RunState) -> RunState | None:
    """The run's attempt after the abandoned ``state``, if one is live and shown here."""
    if not state.abandoned:
        return None
    newer = await runs.follow(state.chat_id, state.run_id)
    if newer is None or newer is state or newer.abandoned or newer.epoch == state.epoch:
        return None
    return newer


async def _wake_at(shutdown: anyio.Event, state: RunState) -> None:
    """Once ``shutdown`` is set, wake the stream waiting on ``state``'s log: it ends."""
    await shutdown.wait()
    # Wakes the run's other readers too; each sees its own event set (sse-starlette
    # sets them all at one shutdown) or, a turn early, sends one ping and waits on.
    state.append_nothing()
