"""EventStreamResponse: each event one send; a client that leaves or stops reading is let go."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from webapp.web import event_stream
from webapp.web.event_stream import EventStreamResponse


class Events:
    """Yields ``first`` then waits forever (a live run with nothing new); knows if it was closed."""

    def __init__(self, first: list[bytes], then_end: bool = False) -> None:
        self.first, self.then_end, self.closed = first, then_end, False

    async def __call__(self) -> AsyncIterator[bytes]:
        try:
            for chunk in self.first:
                yield chunk
            if not self.then_end:
                await asyncio.Event().wait()
        finally:
            self.closed = True


async def quiet_receive() -> dict[str, Any]:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_each_event_is_one_send_then_the_body_ends():
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    events = Events([b"a", b"b"], then_end=True)
    await asyncio.wait_for(EventStreamResponse(events())({}, quiet_receive, send), 1)
    start = sent[0]
    headers = dict(start["headers"])
    assert start["status"] == 200
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert headers[b"cache-control"] == b"no-store"
    assert headers[b"x-accel-buffering"] == b"no"  # a proxy must not hold events back
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [
        (b"a", True),
        (b"b", True),
        (b"", False),
    ]
    assert events.closed


async def test_a_client_that_leaves_ends_the_stream_and_its_cleanup_runs():
    left = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message.get("body") == b"a":
            left.set()  # the client goes away after the first event

    events = Events([b"a"])
    await asyncio.wait_for(EventStreamResponse(events())({}, receive, send), 1)
    assert events.closed


async def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(event_stream, "CHECK_SECONDS", 0.02)
    bodies: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message["body"])
            if len(bodies) == 2:
                await asyncio.Event().wait()  # the socket is full: this send never returns

    events = Events([b"a", b"b", b"c"])
    loop = asyncio.get_running_loop()
    start = loop.time()
    response = EventStreamResponse(events(), send_timeout=0.2)
    await asyncio.wait_for(response({}, quiet_receive, send), 2)
    assert 0.2 <= loop.time() - start < 1.5
    assert bodies == [b"a", b"b"] and events.closed


async def test_a_slow_reader_within_the_send_timeout_is_kept(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(event_stream, "CHECK_SECONDS", 0.02)
    bodies: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            await asyncio.sleep(0.05)  # slow, but it reads
            bodies.append(message["body"])

    events = Events([b"a", b"b", b"c"], then_end=True)
    await asyncio.wait_for(
        EventStreamResponse(events(), send_timeout=0.2)({}, quiet_receive, send), 2
    )
    assert bodies == [b"a", b"b", b"c", b""]


async def test_a_server_shutting_down_ends_the_stream_cleanly():
    sent: list[dict[str, Any]] = []
    stopping = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message.get("body") == b"a":
            stopping.set()  # the server begins to shut down while the stream is live

    events = Events([b"a"])
    response = EventStreamResponse(events(), stopping=stopping)
    await asyncio.wait_for(response({}, quiet_receive, send), 1)
    assert events.closed
    # the body ends properly: the browser's EventSource reconnects, it does not see an error
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(b"a", True), (b"", False)]
