"""OpenAIChatModel's connections against raw loopback servers: what reaches the endpoint.

Each test runs its own event loop, once on asyncio's and once on uvloop's (the
app serves on uvloop), with a raw asyncio server in the same loop that answers
exactly as the test needs: keep-alive, a connection dropped before or during
an answer, a proxy, TLS with a certificate made for the test, gzip.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import ssl
import subprocess
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from webapp.errors import ModelError
from webapp.models.openai_chat import OpenAIChatModel
from webapp.runtime.model import ModelRequest, TextPart
from webapp.transcript import UserEntry

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
LOOPS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


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
    """One whole request (head and body) off the connection; returns its body."""
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


async def serving(
    handler: Handler,
    body: Callable[[int], Coroutine[Any, Any, None]],
    tls: ssl.SSLContext | None = None,
) -> None:
    """Serve ``handler`` on a loopback port while ``body(port)`` runs, bounded in time."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=tls)
    async with server:
        port = server.sockets[0].getsockname()[1]
        await asyncio.wait_for(body(port), timeout=20)


def ask(text: str = "hi") -> ModelRequest:
    return ModelRequest(system="", entries=[UserEntry(text)])


async def texts(model: OpenAIChatModel, text: str = "hi") -> str:
    return "".join([p.text async for p in model.stream(ask(text)) if isinstance(p, TextPart)])


@LOOPS
def test_consecutive_calls_stream_whole_over_one_kept_alive_connection(
    run: Callable[..., Any],
) -> None:
    words = [f"w{i} " for i in range(300)]
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        for _ in range(2):
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
            assert await texts(model) == "".join(words)
            assert await texts(model) == "".join(words)
        assert connections == 1  # the second call went on the kept-alive connection

    run(serving(handler, body))


@LOOPS
def test_a_post_dropped_on_a_reused_connection_before_its_answer_is_not_sent_again(
    run: Callable[..., Any],
) -> None:
    """The endpoint got the POST and may be generating: sending it again pays twice."""
    received: list[tuple[int, bytes]] = []  # (connection number, request body)
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        number = connections
        while True:
            try:
                received.append((number, await read_request(reader)))
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            if number == 1 and len(received) == 2:
                break  # the second request on the first connection: read, and no answer
            writer.write(STREAM_HEAD + sse("answer") + STREAM_END)  # a resend would get this
            await writer.drain()
        writer.close()

    async def body(port: int) -> None:
        url = f"http://127.0.0.1:{port}/v1"
        # Retries left at their default: a dropped connection must not use them either.
        async with OpenAIChatModel("m", base_url=url, retry_backoff=0.01) as model:
            assert await texts(model, "first") == "answer"
            with pytest.raises(ModelError) as caught:
                await texts(model, "second")
            await asyncio.sleep(0.2)  # room for a late resend to arrive, if one were made
        message = str(caught.value)
        assert f"{url}/chat/completions" in message
        assert "closed before its answer" in message and "not sent again" in message
        assert [(n, b'"second"' in sent) for n, sent in received] == [(1, False), (1, True)]
        assert connections == 1

    run(serving(handler, body))


@LOOPS
def test_an_idle_connection_the_server_closed_is_not_reused(run: Callable[..., Any]) -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(STREAM_HEAD + sse("ok") + STREAM_END)  # keep-alive...
        await writer.drain()
        writer.close()  # ...but the server closes it once idle

    async def body(port: int) -> None:
        async with OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1") as model:
            for _ in range(3):
                assert await texts(model) == "ok"
                await asyncio.sleep(0.05)  # the close reaches the client
        assert connections == 3

    run(serving(handler, body))


@LOOPS
def test_a_connection_closed_or_reset_mid_stream_fails_naming_the_endpoint(
    run: Callable[..., Any],
) -> None:
    async def closes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + sse("half"))
        await writer.drain()
        writer.close()

    async def resets(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + sse("half"))
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        writer.transport.abort()  # linger 0: an RST, not a FIN

    async def body(port: int) -> None:
        url = f"http://127.0.0.1:{port}/v1"
        got: list[str] = []
        async with OpenAIChatModel("m", base_url=url) as model:
            with pytest.raises(ModelError, match="broke mid-response") as caught:
                async for part in model.stream(ask()):
                    if isinstance(part, TextPart):
                        got.append(part.text)
        assert f"{url}/chat/completions" in str(caught.value)
        assert got == ["half"]  # what came before the break was streamed

    run(serving(closes, body))
    run(serving(resets, body))


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
def test_https_endpoints_stream_over_tls_trusting_ssl_cert_file(
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

    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    run(serving(handler, untrusted, server_tls))
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # httpx trusts what this names
    run(serving(handler, trusted, server_tls))


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
