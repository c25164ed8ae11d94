"""The model client's sockets on plain asyncio: an httpcore network backend.

httpx sends through httpcore, whose default backend on asyncio is anyio.
anyio's read, for every chunk a model streams, opens a cancel scope with a
timer, asks sniffio which library runs, and waits on its own event. Reading 50
streams at a model's pace (25 tokens/s) through httpx on uvloop cost 187 µs of
CPU per token on anyio, 108 µs on this backend, and 45 µs with bare asyncio
streams and no HTTP at all. Here a socket is an `asyncio.Protocol` that keeps
what arrived, and a read takes it, or waits on one future with one timer.

httpx and httpcore keep everything else: the connection pool, keep-alive,
HTTP/1.1 (h11), TLS settings, proxies, redirects and the error types
(`httpcore.ReadTimeout` becomes `httpx.ReadTimeout` as before). `client`
builds an ordinary httpx client and gives the pool of its direct connections
this backend.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any, cast

import httpcore
import httpx

HIGH_WATER = 256 * 1024  # bytes received and not yet read: reading pauses above this
LOW_WATER = 64 * 1024  # and resumes below this


def client(*, timeout: httpx.Timeout, limits: httpx.Limits) -> httpx.AsyncClient:
    """An httpx client whose direct connections run on `AsyncioBackend`.

    The client is httpx's own, so proxies named by the environment (HTTP_PROXY,
    HTTPS_PROXY, ALL_PROXY, NO_PROXY) and SSL_CERT_FILE work as in any httpx
    client; requests through a proxy keep httpx's default backend.
    """
    made = httpx.AsyncClient(timeout=timeout, limits=limits)
    pool = getattr(getattr(made, "_transport", None), "_pool", None)
    if isinstance(pool, httpcore.AsyncConnectionPool) and hasattr(pool, "_network_backend"):
        pool._network_backend = AsyncioBackend()
    # else an httpx that builds its transport otherwise: it still works, on anyio
    return made


class _Socket(asyncio.Protocol):
    """One connection's received bytes and its waiting reader or writer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.received: list[bytes] = []
        self.size = 0
        self.ended = False  # EOF or the connection lost: nothing more will come
        self.error: BaseException | None = None
        self.reader: asyncio.Future[None] | None = None
        self.writer: asyncio.Future[None] | None = None
        self.reading_paused = False
        self.writing_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received.append(data)
        self.size += len(data)
        if self.size > HIGH_WATER and not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()
        _wake(self.reader)

    def eof_received(self) -> None:
        self.ended = True  # returning None: the transport closes itself
        _wake(self.reader)

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended, self.error = True, exc
        _wake(self.reader)
        _wake(self.writer)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        _wake(self.writer)


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def _expire(waiter: asyncio.Future[None], error: Exception) -> None:
    if not waiter.done():
        waiter.set_exception(error)


async def _wait(socket: _Socket, slot: str, timeout: float | None, error: Exception) -> None:
    """Wait on a new future in ``socket.<slot>``; ``error`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    setattr(socket, slot, waiter)
    timer = None if timeout is None else loop.call_later(timeout, _expire, waiter, error)
    try:
        await waiter
    finally:
        setattr(socket, slot, None)
        if timer is not None:
            timer.cancel()


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, transport: asyncio.Transport, socket: _Socket) -> None:
        self._transport, self._socket = transport, socket

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        socket = self._socket
        if not socket.received and not socket.ended:
            await _wait(socket, "reader", timeout, httpcore.ReadTimeout("the read timed out"))
        received = socket.received
        if not received:
            if socket.error is not None:
                raise httpcore.ReadError(_describe(socket.error))
            return b""  # the peer closed the connection
        if len(received) == 1 and len(received[0]) <= max_bytes:
            data = received.pop()
        else:
            data = b"".join(received)
            received.clear()
            if len(data) > max_bytes:
                received.append(data[max_bytes:])
                data = data[:max_bytes]
        socket.size -= len(data)
        if socket.reading_paused and socket.size < LOW_WATER:
            socket.reading_paused = False
            self._transport.resume_reading()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        socket = self._socket
        if socket.ended or self._transport.is_closing():
            raise httpcore.WriteError(_describe(socket.error) if socket.error else "closed")
        self._transport.write(buffer)
        if socket.writing_paused:
            await _wait(socket, "writer", timeout, httpcore.WriteTimeout("the write timed out"))
            if socket.error is not None:
                raise httpcore.WriteError(_describe(socket.error))

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                secured = await loop.start_tls(
                    self._transport, self._socket, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError as exc:
            self._transport.close()
            raise httpcore.ConnectTimeout("the TLS handshake timed out") from exc
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise httpcore.ConnectError(_describe(exc)) from exc
        self._socket.transport = cast(asyncio.Transport, secured)
        return AsyncioStream(self._socket.transport, self._socket)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # httpcore: has an idle connection been closed or written to?
            return bool(self._socket.received) or self._socket.ended
        name = {"client_addr": "sockname", "server_addr": "peername"}.get(info, info)
        if name in ("ssl_object", "sockname", "peername", "socket"):
            return self._transport.get_extra_info(name)
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """TCP connections (the client never asks for a Unix socket)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        local = (local_address, 0) if local_address else None
        loop = asyncio.get_running_loop()
        connecting = loop.create_connection(_Socket, host, port, local_addr=local)
        return await _connect(connecting, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def _connect(
    connecting: Any, timeout: float | None, socket_options: Iterable[Any] | None
) -> AsyncioStream:
    try:
        async with asyncio.timeout(timeout):
            transport, socket = await connecting
    except TimeoutError as exc:
        raise httpcore.ConnectTimeout("connecting timed out") from exc
    except OSError as exc:
        raise httpcore.ConnectError(_describe(exc)) from exc
    for option in socket_options or ():
        transport.get_extra_info("socket").setsockopt(*option)
    return AsyncioStream(transport, socket)


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
