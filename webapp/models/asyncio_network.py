"""The model client's HTTP/1.1 on plain asyncio, parsed by httptools: an httpx transport.

A model streams its reply as one small HTTP chunk per token. Through httpx's
own transport every chunk passed h11 (an event, a state machine step) and six
generators on its way out, and anyio's read around each. Here a connection is
an `asyncio.Protocol` whose bytes go straight into httptools (llhttp, in C:
uvicorn's parser, already a dependency), and a read hands over every body
byte that arrived since the last one in a single piece. Reading 50 streams at
a model's pace (25 tokens/s) through httpx cost about 60 µs of CPU per token on
its own transport and about 35 µs on this one; when a fast model's tokens
arrive together, the saving grows with every token a read holds.

The client stays httpx's own: its API, redirects, content decoding, error
types, and proxies named by the environment (requests through a proxy keep
httpx's transport). This transport carries the direct connections: a pool of
kept-alive ones per host, TLS from `httpx.create_ssl_context` (so
SSL_CERT_FILE works), connect/read/write/pool timeouts from the request.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import cast

import httptools
import httpx

# Body bytes received and not yet read: reading pauses above this, until the
# reader takes them (it takes all there is at once).
HIGH_WATER = 256 * 1024

_Origin = tuple[str, str, int]  # scheme, host, port


def client(*, timeout: httpx.Timeout, limits: httpx.Limits) -> httpx.AsyncClient:
    """An httpx client whose direct connections go through `AsyncioTransport`.

    Built as an ordinary client first, so that proxies named by the
    environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY) are mounted as
    in any httpx client -- passing ``transport=`` would turn them off.
    """
    # One trust store for both (SSL_CERT_FILE and SSL_CERT_DIR are read here), loaded once.
    trust = httpx.create_ssl_context(trust_env=True)
    made = httpx.AsyncClient(timeout=timeout, limits=limits, verify=trust)
    if isinstance(getattr(made, "_transport", None), httpx.AsyncHTTPTransport):
        made._transport = AsyncioTransport(limits=limits, ssl_context=trust)
    # else an httpx that keeps its transport elsewhere: it still works, on its own transport
    return made


class AsyncioTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over kept-alive asyncio connections.

    At most ``limits.max_connections`` requests are in flight (others wait, up
    to the pool timeout); up to ``limits.max_keepalive_connections`` idle
    connections are kept per host for the next request.
    """

    def __init__(self, *, limits: httpx.Limits, ssl_context: ssl.SSLContext) -> None:
        self._ssl_context = ssl_context
        self._busy = asyncio.Semaphore(limits.max_connections or 1_000_000)
        self._keep = (
            20 if limits.max_keepalive_connections is None else limits.max_keepalive_connections
        )
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("the HTTP client has been closed")
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(
                f"unsupported URL scheme {url.scheme!r}", request=request
            )
        timeouts = request.extensions.get("timeout", {})
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        message = await _request_bytes(request)
        connection: _Connection | None = None
        try:
            async with asyncio.timeout(timeouts.get("pool")):
                await self._busy.acquire()
        except TimeoutError as exc:
            raise httpx.PoolTimeout("no connection came free in time", request=request) from exc
        try:
            connection, reused = self._take_idle(origin), True
            while True:
                if connection is None:
                    connection, reused = await self._connect(origin, request, timeouts), False
                try:
                    await connection.send(message, request, timeouts.get("write"))
                    await connection.receive_head(request, timeouts.get("read"))
                    break
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                    connection.close()
                    # A kept-alive connection the server closed as we reused it: nothing
                    # reached the server's application, so the request goes again, once.
                    if not (reused and connection.nothing_received):
                        raise
                    connection = None
        except BaseException:
            if connection is not None:
                connection.close()
            self._busy.release()
            raise
        head_only = request.method == "HEAD"
        return httpx.Response(
            connection.status,
            headers=connection.headers,
            stream=_Body(self, origin, connection, request, timeouts.get("read"), head_only),
            extensions={
                "http_version": connection.http_version,
                "reason_phrase": connection.reason,
                "connection": connection,
            },
        )

    def _take_idle(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin, [])
        while idle:
            connection = idle.pop()
            if connection.reusable():
                return connection
            connection.close()
        return None

    def _release(self, origin: _Origin, connection: _Connection, reuse: bool) -> None:
        self._busy.release()
        idle = self._idle.setdefault(origin, [])
        if reuse and not self._closed and connection.reusable() and len(idle) < self._keep:
            idle.append(connection)
        else:
            connection.close()

    async def _connect(
        self, origin: _Origin, request: httpx.Request, timeouts: dict[str, float | None]
    ) -> _Connection:
        scheme, host, port = origin
        context = self._ssl_context if scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeouts.get("connect")):
                _, connection = await loop.create_connection(
                    _Connection, host, port, ssl=context, server_hostname=host if context else None
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("connecting timed out", request=request) from exc
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(_describe(exc), request=request) from exc
        return connection

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


async def _request_bytes(request: httpx.Request) -> bytes:
    """The request line, headers and body, framed as HTTP/1.1."""
    url = request.url
    lines = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), url.raw_path)]
    lines += [b"%s: %s" % (name, value) for name, value in request.headers.raw]
    body = [part async for part in request.stream]  # type: ignore[union-attr]
    if request.headers.get("transfer-encoding", "").lower() == "chunked":
        body = [b"%x\r\n%s\r\n" % (len(part), part) for part in body if part] + [b"0\r\n\r\n"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + b"".join(body)


class _Body(httpx.AsyncByteStream):
    """A response's body: every byte that arrived since the last read, in one piece."""

    def __init__(
        self,
        transport: AsyncioTransport,
        origin: _Origin,
        connection: _Connection,
        request: httpx.Request,
        timeout: float | None,
        head_only: bool,
    ) -> None:
        self._transport, self._origin, self._connection = transport, origin, connection
        self._request, self._timeout = request, timeout
        self._done = head_only  # a HEAD answer has no body, whatever its length says
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        while not self._done:
            data = connection.take_body()
            if data:
                yield data
            elif connection.complete:
                self._done = True
            else:
                await connection.wait_body(self._request, self._timeout)

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            complete = self._done and not self._connection.body and self._connection.complete
            self._transport._release(self._origin, self._connection, reuse=complete)


class _Connection(asyncio.Protocol):
    """One connection: its bytes fed to httptools, the response they make, its waiter."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.reason = b""
        self.http_version = b"HTTP/1.1"
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.body: list[bytes] = []
        self.size = 0  # body bytes received and not yet taken
        self.complete = False
        self.keep_alive = False
        self.until_close = False  # a body without a length ends when the connection does
        self.nothing_received = True
        self.ended = False  # EOF or the connection lost: nothing more will come
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.writing_paused = False
        self.reading_paused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.nothing_received = False
        if self.parser is None or self.complete:  # bytes nobody asked for: not reusable
            self.error = httpx.RemoteProtocolError("the server sent data nobody asked for")
            self.close()
        else:
            try:
                self.parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                self.error = httpx.RemoteProtocolError(f"malformed HTTP response: {exc}")
                self.close()
            if self.size > HIGH_WATER and not self.reading_paused and self.transport is not None:
                self.reading_paused = True
                self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> None:
        self._ended(None)  # returning None: the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake()

    # httptools callbacks

    def on_status(self, status: bytes) -> None:
        self.reason += status  # may come in pieces, as the bytes arrive

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        if self.parser.get_status_code() < 200:  # 100 Continue and the like: the answer follows
            self.headers, self.reason = [], b""
            return
        self.status = self.parser.get_status_code()
        self.http_version = b"HTTP/" + self.parser.get_http_version().encode("ascii")
        self.keep_alive = self.parser.should_keep_alive()
        names = {name.lower() for name, _ in self.headers}
        self.until_close = b"content-length" not in names and b"transfer-encoding" not in names
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.size += len(body)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True

    # used by the transport

    def reusable(self) -> bool:
        return not self.ended and self.error is None and self.keep_alive and self.complete

    async def send(self, message: bytes, request: httpx.Request, timeout: float | None) -> None:
        """Start a new exchange: reset what the last response left, then write ``message``."""
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.reason, self.headers, self.head_done = 0, b"", [], False
        self.complete = self.keep_alive = self.until_close = False
        self.nothing_received = True
        if self.ended or self.transport is None or self.transport.is_closing():
            raise httpx.WriteError("the connection is closed", request=request)
        self.transport.write(message)
        while self.writing_paused and not self.ended:
            await self._wait(timeout, httpx.WriteTimeout, request)
        if self.ended and self.error is not None:
            raise httpx.WriteError(_describe(self.error), request=request)

    async def receive_head(self, request: httpx.Request, timeout: float | None) -> None:
        while not self.head_done:
            self._check(request, "before a response")
            await self._wait(timeout, httpx.ReadTimeout, request)

    def take_body(self) -> bytes:
        body = self.body
        if not body:
            return b""
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self.size = 0
        if self.reading_paused and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()
        return data

    async def wait_body(self, request: httpx.Request, timeout: float | None) -> None:
        if self.ended and self.until_close and self.error is None:
            self.complete = True  # the end of the connection is the end of this body
            return
        self._check(request, "before the whole response body")
        await self._wait(timeout, httpx.ReadTimeout, request)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _check(self, request: httpx.Request, when: str) -> None:
        if isinstance(self.error, httpx.RemoteProtocolError):
            raise type(self.error)(str(self.error), request=request)
        if self.error is not None:
            raise httpx.ReadError(_describe(self.error), request=request)
        if self.ended:
            raise httpx.RemoteProtocolError(
                f"the server closed the connection {when}", request=request
            )

    async def _wait(
        self, timeout: float | None, error: type[httpx.TimeoutException], request: httpx.Request
    ) -> None:
        """Until something arrives or the transport may write again; ``error`` after ``timeout``."""
        loop = asyncio.get_running_loop()
        self.waiter = waiter = loop.create_future()
        timer = None
        if timeout is not None:
            timer = loop.call_later(timeout, _expire, waiter, error, request)
        try:
            await waiter
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _ended(self, exc: BaseException | None) -> None:
        self.ended = True
        if exc is not None and self.error is None:
            self.error = exc
        self._wake()


def _expire(
    waiter: asyncio.Future[None], error: type[httpx.TimeoutException], request: httpx.Request
) -> None:
    if not waiter.done():
        what = "write" if error is httpx.WriteTimeout else "read"
        waiter.set_exception(error(f"the {what} timed out", request=request))


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
