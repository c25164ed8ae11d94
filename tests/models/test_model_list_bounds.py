"""An endpoint's ``GET /models`` read within bounds (SPEC §17): a total deadline, bytes,
count and length of ids. Real HTTP servers on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from chat_server import ChatServer

from webapp.config import EndpointConfig
from webapp.models.endpoints import ModelRegistry
from webapp.models.model_list import MAX_BODY_BYTES, MAX_MODELS


@pytest.fixture
def trickling_port() -> Iterator[int]:
    """An HTTP server whose /models answer is ``{"data": [`` then a space every 0.2 s."""
    stop = threading.Event()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)
                head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                conn.sendall(head + b'transfer-encoding: chunked\r\n\r\n2\r\n{"\r\n')
                conn.sendall(b'8\r\ndata": [\r\n')
                try:
                    for _ in range(300):  # a minute, if nobody gives up
                        if stop.wait(0.2):
                            break
                        conn.sendall(b"1\r\n \r\n")
                except OSError:
                    pass  # the client gave up: what we want

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    stop.set()
    thread.join(timeout=5)
    listener.close()


async def test_a_models_list_that_trickles_is_given_up_on_at_a_total_deadline(
    trickling_port: int,
) -> None:
    models = ModelRegistry(
        [EndpointConfig("slow", f"http://127.0.0.1:{trickling_port}/v1")], timeout=0.5
    )
    started = time.monotonic()
    await models.refresh()  # on main: each read is on time, so it waits for the whole minute
    assert time.monotonic() - started < 5
    [slow] = models.statuses()
    assert slow.error is not None and "did not answer in full within 1.5 s" in slow.error
    assert models.names() == []


async def test_a_huge_models_list_is_refused_past_its_byte_bound(chat_server: ChatServer) -> None:
    ids = [{"id": f"model-{i:09d}"} for i in range(MAX_BODY_BYTES // 20)]
    chat_server.models_body = json.dumps({"data": ids})
    models = ModelRegistry([EndpointConfig("big", chat_server.base_url)])
    await models.refresh()
    [big] = models.statuses()
    assert big.error is not None and "more than 4 MB" in big.error and models.names() == []


async def test_only_so_many_ids_are_offered_and_each_is_a_sane_name(
    chat_server: ChatServer, caplog: pytest.LogCaptureFixture
) -> None:
    bad = ["x" * 1_000_000, "evil\u202egpt", "tab\there", "zero\u200bwidth", "  ", "dup", "dup"]
    chat_server.models = bad + [f"m{i}" for i in range(10_000)]
    models = ModelRegistry([EndpointConfig("many", chat_server.base_url)])
    with caplog.at_level(logging.WARNING, logger="webapp.models.endpoints"):
        await models.refresh()
    names = models.names()
    assert len(names) == MAX_MODELS  # on main: all 10,005 (and the 1 MB one)
    assert names[:2] == ["many/dup", "many/m0"]
    assert max(len(n) for n in names) < 300
    assert "left out 4 model ids" in caplog.text and "only the first 1000" in caplog.text


async def test_the_list_is_parsed_off_the_event_loop(chat_server: ChatServer) -> None:
    chat_server.models = [f"model-{i:06d}" for i in range(MAX_MODELS)]
    seen: list[str] = []
    loop_thread = threading.get_ident()
    from webapp.models import model_list

    original = model_list.model_ids

    def watched(body: bytes, url: str) -> tuple[str, ...]:
        seen.append("loop" if threading.get_ident() == loop_thread else "worker")
        return original(body, url)

    model_list.model_ids = watched  # type: ignore[assignment]
    try:
        models = ModelRegistry([EndpointConfig("e", chat_server.base_url)])
        await asyncio.wait_for(models.refresh(), 10)
    finally:
        model_list.model_ids = original
    assert seen == ["worker"] and len(models.names()) == MAX_MODELS


async def test_refreshes_pressed_at_once_ask_the_endpoint_once(chat_server: ChatServer) -> None:
    chat_server.models = ["m1", "m2"]
    models = ModelRegistry([EndpointConfig("e", chat_server.base_url)])
    await asyncio.gather(*(models.refresh() for _ in range(20)))
    assert chat_server.models_asked == 1 and models.names() == ["e/m1", "e/m2"]
    await models.refresh()  # the next one asks again
    assert chat_server.models_asked == 2
