"""An ASGI response that sends an event stream: bytes from an async iterator, as they come.

Written for the run stream, where a model's pace means one small event per
token per client: each event costs one ``send`` and nothing else. It replaces
sse-starlette's ``EventSourceResponse``, whose timeout scope, checks and log
call around every send took 15% of the server's CPU in a profile of 50 paced
streams. What a general SSE response does around every send is done here once
per connection:

1. A client that leaves is noticed by one task waiting on ``receive`` for the
   whole connection; the stream's iterator is then cancelled at its await
   (its ``finally`` runs) and the response returns.
2. A client that takes no data for ``send_timeout`` seconds (its socket full:
   the server's send blocks) is checked for every few seconds by that same
   task, not by a timer around each send, and dropped the same way.
3. Keep-alive comments are the iterator's business: it knows when it has had
   nothing to say (see `webapp.web.sse.stream`).
4. A server shutting down ends every stream at once when its ``stopping``
   event is set (`webapp.__main__` sets it on SIGINT/SIGTERM), rather than
   holding the graceful shutdown for its full timeout; the browsers reconnect
   to whichever process serves next.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

HEADERS = {
    "cache-control": "no-store",
    "x-accel-buffering": "no",  # nginx: pass each event on at once, unbuffered
}
CHECK_SECONDS = 5.0  # how often a stuck send is looked for


class EventStreamResponse(Response):
    """``text/event-stream`` from ``events`` (already-encoded events and comments)."""

    media_type = "text/event-stream; charset=utf-8"

    def __init__(
        self,
        events: AsyncIterator[bytes],
        *,
        send_timeout: float = math.inf,
        stopping: asyncio.Event | None = None,
    ) -> None:
        self.events = events
        self.send_timeout = send_timeout
        self.stopping = stopping
        self.status_code, self.background = 200, None
        headers = {**HEADERS, "content-type": self.media_type}
        self.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.sending_since: float | None = None  # loop time the send under way began

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        pump = loop.create_task(self._pump(send, loop))
        listen: asyncio.Future[Message] = asyncio.ensure_future(receive())
        stop = loop.create_task(self.stopping.wait()) if self.stopping is not None else None
        ended = False  # the server ends the stream (shutting down): the body is closed
        try:
            while not pump.done():
                waiting = (pump, listen) if stop is None else (pump, listen, stop)
                await asyncio.wait(
                    waiting, timeout=CHECK_SECONDS, return_when=asyncio.FIRST_COMPLETED
                )
                if stop is not None and stop.done():
                    ended = not pump.done() and self.sending_since is None
                    break
                if listen.done():
                    if listen.result()["type"] == "http.disconnect":
                        break  # the client left
                    listen = asyncio.ensure_future(receive())
                elif self._stuck(loop):
                    break
        finally:
            for task in (pump, listen, stop):
                if task is not None:
                    task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump  # the iterator's cleanup has run; its errors surface here
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listen
        if ended:  # a clean end of stream: the browser reconnects, to the next process
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send, loop: asyncio.AbstractEventLoop) -> None:
        try:
            async for chunk in self.events:
                self.sending_since = loop.time()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                self.sending_since = None
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:  # cancelled mid-send: the iterator's cleanup runs now
                await aclose()

    def _stuck(self, loop: asyncio.AbstractEventLoop) -> bool:
        since = self.sending_since
        return since is not None and loop.time() - since > self.send_timeout
