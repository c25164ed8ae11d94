"""Streamable HTTP to an MCP server, with each message bounded in bytes (SPEC §17).

The SDK reads a server's answers (a JSON body, or Server-Sent Events) through
the httpx client it is given, whole, and parses them on the event loop. The
client's response hook (`bound_response`, an httpx event hook) wraps each
answer's byte stream before anything reads it: only whole events (or the
whole JSON body) go on, each at most `webapp.mcp_stdio.MAX_MESSAGE_BYTES`.
Past that, the rest is never read: the answer ends with a JSON-RPC error for
the request it answers ("the result is larger than 4 MB"), which the call
turns into an error result the model reads, as over stdio. A stream that
answers no request of ours (the server's own) just ends there; the SDK opens
it again. The client asks for answers uncompressed (`HEADERS`): a compressed
one could not be cut by event, and a small one can expand to any size, so it
is refused whole.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import httpx

from webapp.mcp_stdio import MAX_MESSAGE_BYTES

logger = logging.getLogger("webapp.mcp_servers")

INTERNAL_ERROR = -32603
HEADERS = {"Accept-Encoding": "identity"}


async def bound_response(response: httpx.Response) -> None:
    """httpx response hook: the answer's messages at most `MAX_MESSAGE_BYTES` each."""
    kind = response.headers.get("content-type", "").lower()
    if not kind.startswith(("application/json", "text/event-stream")):
        return
    compressed = response.headers.get("content-encoding", "identity").lower() != "identity"
    response.stream = _Bounded(
        response.stream,
        MAX_MESSAGE_BYTES,
        kind.startswith("text/event-stream"),
        _request_id(response.request),
        refuse=compressed,
    )


def _request_id(request: httpx.Request) -> object:
    """The JSON-RPC id of the request a POST carries (None: not one, or none)."""
    if request.method != "POST":
        return None
    try:
        body = json.loads(request.content)
    except (ValueError, httpx.RequestNotRead):
        return None
    return body.get("id") if isinstance(body, dict) and "method" in body else None


class _Bounded(httpx.AsyncByteStream):
    def __init__(
        self,
        inner: httpx.AsyncByteStream | httpx.SyncByteStream,
        max_bytes: int,
        events: bool,
        request_id: object,
        *,
        refuse: bool,
    ) -> None:
        self.inner = inner
        self.max_bytes = max_bytes
        self.events = events
        self.request_id = request_id
        self.refuse = refuse

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.refuse or not isinstance(self.inner, httpx.AsyncByteStream):
            yield self._refusal("compressed")
            return
        pending = bytearray()  # the event being read, or the JSON body: never cut
        async for chunk in self.inner:
            start = max(0, len(pending) - 3)  # a separator may span two chunks
            pending += chunk
            if self.events:
                lf, crlf = pending.rfind(b"\n\n", start), pending.rfind(b"\r\n\r\n", start)
                end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
                if end:
                    yield bytes(pending[:end])
                    del pending[:end]
            if len(pending) > self.max_bytes:
                yield self._refusal("larger")
                return
        if pending:
            yield bytes(pending)

    def _refusal(self, why: str) -> bytes:
        limit = self.max_bytes // (1024 * 1024) or 1
        if why == "compressed":
            reason = "the server compressed its answer, which this app does not read"
        else:
            reason = f"the result is larger than {limit} MB; ask for less"
        logger.warning(
            "an MCP server's answer to request %s was refused: %s", self.request_id, reason
        )
        if self.request_id is None:
            return b""
        error = {"code": INTERNAL_ERROR, "message": reason}
        text = json.dumps({"jsonrpc": "2.0", "id": self.request_id, "error": error})
        return f"event: message\ndata: {text}\n\n".encode() if self.events else text.encode()

    async def aclose(self) -> None:
        if isinstance(self.inner, httpx.AsyncByteStream):
            await self.inner.aclose()
