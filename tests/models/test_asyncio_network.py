"""The model client's HTTP transport (`webapp.models.asyncio_network`) against real loopback servers.

Each test runs its own event loop, once on asyncio's and once on uvloop's (the
app serves on uvloop, whose transports are not asyncio's classes), with a raw
asyncio server in the same loop that answers exactly as the test needs: a
stream, a stall, a close or a reset mid-body, a body far larger than the
read buffer, TLS with a certificate made for the test.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvloop

from webapp.errors import ModelError
from webapp.models import asyncio_network
from webapp.models.openai_chat import OpenAIChatModel
from webapp.runtime.model import ModelRequest, TextPart
from webapp.transcript import UserEntry

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
LOOPS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
LIMITS = httpx.Limits(max_connections=10, max_keepalive_connections=10)
TIMEOUT = httpx.Timeout(10.0)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(text: str, finish: str | None = None) -> bytes:
    delta = f'{{"content":"{text}"}}' if finish is None else "{}"
    reason = "null" if finish is None else f'"{finish}"'
    return f'data: {{"choices":[{{"delta":{delta},"finish_reason":{reason}}}]}}\n\n'.encode()


def sse(text: str, finish: str | None = None) -> bytes:
    return chunk(event(text, finish))


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
STREAM_END = sse("", "stop") + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    return await reader.readexactly(length)


async def begin_stream(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *texts: str
) -> None:
    """Take the request, then send the stream's head and ``texts``."""
    await read_request(reader)
    writer.write(STREAM_HEAD + b"".join(sse(text) for text in texts))
    await writer.drain()


async def serving(
    handler: Handler,
    body: Callable[[int], Coroutine[Any, Any, None]],
    tls: ssl.SSLContext | None = None,
) -> None:
    """Serve ``handler`` on a loopback port while ``body(port)`` runs."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=tls)
    async with server:
        port = server.sockets[0].getsockname()[1]
        await body(port)


def ask(text: str = "hi") -> ModelRequest:
    return ModelRequest(system="", entries=[UserEntry(text)])


async def texts(model: OpenAIChatModel) -> str:
    return "".join([p.text async for p in model.stream(ask()) if isinstance(p, TextPart)])


@LOOPS
def test_the_model_streams_through_this_transport(run: Callable[..., Any]) -> None:
    words = [f"w{i} " for i in range(300)]
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        for _ in range(2):  # one connection serves both requests: it is kept alive
            await read_request(reader)
            writer.write(STREAM_HEAD)
            for i, word in enumerate(words):
                writer.write(sse(word))
                if i % 50 == 0:
                    await writer.drain()
                    await asyncio.sleep(0.002)
            writer.write(STREAM_END)
            await writer.drain()
        writer.close()

    async def body(port: int) -> None:
        async with OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1") as model:
            transport = model._http()._transport  # type: ignore[attr-defined]
            assert isinstance(transport, asyncio_network.AsyncioTransport)
            assert await texts(model) == "".join(words)
            assert await texts(model) == "".join(words)
        assert connections == 1

    run(serving(handler, body))


@LOOPS
def test_a_body_larger_than_the_buffer_arrives_whole_with_reading_paused(
    run: Callable[..., Any],
) -> None:
    piece = bytes(range(256)) * 256  # 64 KiB
    pieces = 32  # 2 MiB in all, eight times the high-water mark
    biggest = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (len(piece) * pieces))
        for _ in range(pieces):
            writer.write(piece)
            await writer.drain()  # blocks while the client's reading is paused
        writer.close()

    async def body(port: int) -> None:
        nonlocal biggest
        got = bytearray()
        async with (
            asyncio_network.client(timeout=TIMEOUT, limits=LIMITS) as http,
            http.stream("GET", f"http://127.0.0.1:{port}/") as response,
        ):
            async for data in response.aiter_raw():
                got += data
                await asyncio.sleep(0.001)  # a slow reader: the socket fills up
                biggest = max(biggest, response.extensions["connection"].size)
        assert bytes(got) == piece * pieces
        # Paused past the high-water mark, and then held: one read of the loop more at most
        # (uvloop reads up to 256 KiB at once), never the whole body.
        assert asyncio_network.HIGH_WATER <= biggest <= asyncio_network.HIGH_WATER + 256 * 1024

    run(serving(handler, body))


@LOOPS
def test_a_stalled_stream_times_out_as_a_read_timeout(run: Callable[..., Any]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await begin_stream(reader, writer, "partial")
        await asyncio.sleep(5)  # then nothing
        writer.close()

    async def body(port: int) -> None:
        model = OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", timeout=0.3)
        got: list[str] = []
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(ModelError, match="stalled: no data for 0.3 s"):
            async for part in model.stream(ask()):
                if isinstance(part, TextPart):
                    got.append(part.text)
        assert 0.25 < loop.time() - start < 2
        assert got == ["partial"]
        await model.aclose()

    run(serving(handler, body))


@LOOPS
def test_a_connection_closed_or_reset_mid_stream_is_an_error(run: Callable[..., Any]) -> None:
    async def closes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await begin_stream(reader, writer, "half")
        writer.close()

    async def resets(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await begin_stream(reader, writer, "half")
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.transport.abort()  # linger 0: an RST, not a FIN

    async def body(port: int) -> None:
        async with asyncio_network.client(timeout=TIMEOUT, limits=LIMITS) as http:
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                async with http.stream("POST", f"http://127.0.0.1:{port}/", json={}) as r:
                    async for _ in r.aiter_raw():
                        pass

    run(serving(closes, body))
    run(serving(resets, body))


@LOOPS
def test_a_refused_connection_is_a_connect_error(run: Callable[..., Any]) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def body() -> None:
        model = OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
        with pytest.raises(ModelError, match="cannot reach the model endpoint .* unreachable"):
            await texts(model)
        await model.aclose()

    run(body())


@LOOPS
def test_an_idle_connection_the_server_closed_is_not_reused(run: Callable[..., Any]) -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")  # keep-alive...
        await writer.drain()
        writer.close()  # ...but the server closes it once idle

    async def body(port: int) -> None:
        async with asyncio_network.client(timeout=TIMEOUT, limits=LIMITS) as http:
            for _ in range(3):
                assert (await http.get(f"http://127.0.0.1:{port}/")).text == "ok"
                await asyncio.sleep(0.05)  # the close reaches the client
        assert connections == 3

    run(serving(handler, body))


@LOOPS
def test_a_proxy_named_by_the_environment_is_used(
    run: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    request_lines: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_lines.append(head.split(b"\r\n")[0])
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(STREAM_HEAD + sse("via ") + sse("proxy") + STREAM_END)
        await writer.drain()
        writer.close()

    for name in ("http_proxy", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)

    async def through(port: int) -> None:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
        # Only the proxy knows this host: a direct connection could not even resolve it.
        async with OpenAIChatModel("m", base_url="http://model.invalid:8000/v1") as model:
            assert await texts(model) == "via proxy"

    run(serving(proxy, through))
    assert request_lines == [b"POST http://model.invalid:8000/v1/chat/completions HTTP/1.1"]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@LOOPS
def test_https_endpoints_stream_over_tls(
    run: Callable[..., Any], certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = certificate
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the client refused the certificate
        writer.write(STREAM_HEAD + sse("secret ") + sse("words") + STREAM_END)
        await writer.drain()
        writer.close()

    async def untrusted(port: int) -> None:
        model = OpenAIChatModel("m", base_url=f"https://127.0.0.1:{port}/v1", max_retries=0)
        with pytest.raises(ModelError, match="CERTIFICATE_VERIFY_FAILED"):
            await texts(model)
        await model.aclose()

    async def trusted(port: int) -> None:
        async with OpenAIChatModel("m", base_url=f"https://127.0.0.1:{port}/v1") as model:
            assert await texts(model) == "secret words"

    run(serving(handler, untrusted, server_tls))
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # httpx trusts what this names
    run(serving(handler, trusted, server_tls))


@LOOPS
def test_a_response_sent_a_byte_at_a_time_reads_whole(run: Callable[..., Any]) -> None:
    words = ["one ", "two ", "three"]
    answer = STREAM_HEAD.replace(b"200 OK", b"200 All Good") + b"".join(map(sse, words))
    answer += STREAM_END

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for i in range(len(answer)):  # every line, header and chunk size cut everywhere
            writer.write(answer[i : i + 1])
            await writer.drain()
            if i % 7 == 0:
                await asyncio.sleep(0)
        writer.close()

    async def body(port: int) -> None:
        async with (
            asyncio_network.client(timeout=TIMEOUT, limits=LIMITS) as http,
            http.stream("POST", f"http://127.0.0.1:{port}/", json={}) as response,
        ):
            assert response.reason_phrase == "All Good"
            assert response.headers["content-type"] == "text/event-stream"
            got = b"".join([piece async for piece in response.aiter_raw()])
        events = [event(word) for word in words] + [event("", "stop"), b"data: [DONE]\n\n"]
        assert got == b"".join(events)

    run(serving(handler, body))


@LOOPS
def test_bodies_end_by_length_by_close_or_too_soon(run: Callable[..., Any]) -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
        b"HTTP/1.0 200 OK\r\n\r\nuntil the connection closes",  # no length: the close ends it
        b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\ncut short",  # the close comes too soon
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",  # no last chunk
        b"this is not HTTP at all\r\n\r\n",
    ]
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(answers[connections - 1])
        await writer.drain()
        writer.close()

    async def body(port: int) -> None:
        url = f"http://127.0.0.1:{port}/"
        async with asyncio_network.client(timeout=TIMEOUT, limits=LIMITS) as http:
            assert (await http.get(url)).text == "hello"
            assert (await http.get(url)).text == "until the connection closes"
            with pytest.raises(httpx.RemoteProtocolError, match="closed the connection before"):
                await http.get(url)
            with pytest.raises(httpx.RemoteProtocolError, match="closed the connection before"):
                await http.get(url)
            with pytest.raises(httpx.RemoteProtocolError, match="malformed HTTP response"):
                await http.get(url)
        assert connections == len(answers)

    run(serving(handler, body))


@LOOPS
def test_a_kept_alive_connection_closed_as_it_is_reused_is_replaced(
    run: Callable[..., Any],
) -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        if connections == 1:
            await read_request(reader)  # the next request arrives, and the server gives up
        writer.close()

    async def body(port: int) -> None:
        async with asyncio_network.client(timeout=TIMEOUT, limits=LIMITS) as http:
            assert (await http.post(f"http://127.0.0.1:{port}/", json={"n": 1})).text == "ok"
            assert (await http.post(f"http://127.0.0.1:{port}/", json={"n": 2})).text == "ok"
        assert connections == 2  # the second request went again, on a new connection

    run(serving(handler, body))


@LOOPS
def test_busy_connections_are_limited_and_waiting_for_one_times_out(
    run: Callable[..., Any],
) -> None:
    release = asyncio.Event()
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                await begin_stream(reader, writer, "first")
            except asyncio.IncompleteReadError:
                break
            await release.wait()
            writer.write(STREAM_END)
            await writer.drain()
        writer.close()

    async def body(port: int) -> None:
        url = f"http://127.0.0.1:{port}/"
        one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with asyncio_network.client(
            timeout=httpx.Timeout(10.0, pool=0.2), limits=one
        ) as http:

            async def whole() -> bytes:
                async with http.stream("POST", url, json={}) as response:
                    return b"".join([piece async for piece in response.aiter_raw()])

            first = asyncio.create_task(whole())
            await asyncio.sleep(0.05)
            with pytest.raises(httpx.PoolTimeout):
                await whole()  # the one connection is busy for longer than the pool timeout
            second = asyncio.create_task(whole())
            await asyncio.sleep(0.05)
            release.set()  # the first ends, and the second goes on its connection
            assert await first == await second
        assert connections == 1

    run(serving(handler, body))


@LOOPS
def test_a_compressed_stream_is_decoded(run: Callable[..., Any]) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        packed = gzip.compress(event("squeezed ") + event("words") + b"data: [DONE]\n\n")
        writer.write(STREAM_HEAD.replace(b"\r\n\r\n", b"\r\ncontent-encoding: gzip\r\n\r\n"))
        writer.write(chunk(packed[:20]) + chunk(packed[20:]) + b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def body(port: int) -> None:
        async with OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1") as model:
            assert await texts(model) == "squeezed words"

    run(serving(handler, body))


@LOOPS
def test_a_body_of_unknown_length_goes_chunked_and_a_head_answer_has_none(
    run: Callable[..., Any],
) -> None:
    received: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:  # the requests of one kept-alive connection
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            if head.startswith(b"HEAD "):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")  # and no body
            else:
                received.append((head.lower(), await reader.readuntil(b"0\r\n\r\n")))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    async def parts() -> AsyncIterator[bytes]:
        yield b"hello "
        yield b""  # an empty part is no chunk: it would end the body
        yield b"world"

    async def body(port: int) -> None:
        url = f"http://127.0.0.1:{port}/"
        async with asyncio_network.client(timeout=TIMEOUT, limits=LIMITS) as http:
            assert (await http.post(url, content=parts())).text == "ok"
            head = await asyncio.wait_for(http.head(url), 5)
            assert head.headers["content-length"] == "5" and head.content == b""
        [(head_sent, body_sent)] = received
        assert b"transfer-encoding: chunked" in head_sent
        assert body_sent == b"6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n"

    run(serving(handler, body))
