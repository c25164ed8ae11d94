"""The SSE endpoint: resumable from any position, no gap, no duplicate; reset after a restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
import pytest
from sse_starlette.sse import AppStatus
from starlette.applications import Starlette
from webhelpers import (
    MakeClient,
    SSEvent,
    WebClient,
    eventually,
    parse_html,
    parse_sse,
    read_events,
    replies,
    serve,
    text_of_fragments,
)

from webapp.models import ScriptedModel
from webapp.runtime.model import FinishPart, ModelPart, ModelRequest, TextPart
from webapp.web import create_app, sse
from webapp.web.event_names import DONE, TEXT
from webapp.web.live.readers import Readers
from webapp.web.live.run_state import LogRecord, RunState
from webapp.web.live.runs import RunManager
from webapp.web.sse import coalesce, parse_position
from webapp.web.view_models import ReplyView

ON_BOTH_DATABASES = True  # every test here that builds the app runs on SQLite and PostgreSQL

NUMBERS = " ".join(str(i) for i in range(1, 61))


async def finished_run(client: WebClient, chat_id: str) -> RunState:
    """The chat's run once its ``done`` record is in the log.

    Not just once the chat is idle: the chat's active run is cleared a moment
    before the final reply is drawn and logged.
    """
    await client.wait_idle(chat_id)
    state = client.web.runs.latest(chat_id)
    assert state is not None

    async def finished() -> bool:
        return state.finished

    await eventually(finished, 10, "the run's done record")
    return state


def test_parse_position():
    assert parse_position("abc.1:42") == ("abc.1", 42)
    assert parse_position("a:b:7") == ("a:b", 7)
    for bad in (None, "", "42", ":3", "x:", "x:-1", "x:1e3", "x:" + "9" * 13):
        assert parse_position(bad) == (None, 0), bad


def test_coalesce_merges_consecutive_text_only():
    records = [
        LogRecord(1, "text", "a"),
        LogRecord(2, "text", "b"),
        LogRecord(3, "tool", "T"),
        LogRecord(4, "text", "c"),
        LogRecord(5, "reasoning", "r"),
        LogRecord(6, "reasoning", "s"),
        LogRecord(7, "done", "D"),
    ]
    assert coalesce(records, 0) == [
        ("text", "ab", 2),
        ("tool", "T", 3),
        ("text", "c", 4),
        ("reasoning", "rs", 6),
        ("done", "D", 7),
    ]
    assert coalesce(records, 1) == [("text", "b", 2), *coalesce(records, 0)[1:]]
    assert coalesce(records, 7) == []


async def test_a_burst_is_logged_as_a_few_records_not_one_per_token(
    web_client_factory: MakeClient,
):
    # 60 words with nothing in between: the run hands over a delta per word, the log
    # records what came in one turn of the event loop as one record.
    client = await web_client_factory(model=ScriptedModel([NUMBERS]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "count")
    state = await finished_run(client, chat_id)
    texts = [r for r in state.records if r.event == TEXT]
    assert "".join(parse_html(r.data).text() for r in texts) == NUMBERS
    assert 1 <= len(texts) <= 10, len(texts)  # paced() hands the loop back in between


async def test_resume_from_last_event_id_has_no_gap_and_no_duplicate(
    web_client_factory: MakeClient,
):
    # At a model's pace, each token is a record of its own (a burst is logged as
    # the pieces the run had ready when its log was written: fewer, longer ones).
    client = await web_client_factory(model=ScriptedModel([NUMBERS], chunk_delay=0.001))
    chat_id = await client.new_chat()
    await client.send(chat_id, "count")
    state = await finished_run(client, chat_id)
    url = f"/chats/{chat_id}/runs/{state.run_id}/events"
    for k in (0, 1, 17, 59):
        seen = "".join(parse_html(r.data).text() for r in state.records[:k] if r.event == "text")
        response = await client.http.get(url, headers={"Last-Event-ID": f"{state.epoch}:{k}"})
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(response.text)
        assert seen + text_of_fragments(events) == NUMBERS, k
        assert [e.event for e in events] == ["text", "done"]  # consecutive deltas coalesced
        assert events[-1].id == f"{state.epoch}:{state.seq}"
        final = parse_html(events[-1].data).find(data_role="assistant")
        assert final.attrs["data-status"] == "completed"
        # The query parameter the page rendered works the same on a fresh connection.
        again = await client.http.get(url, params={"after": f"{state.epoch}:{k}"})
        assert parse_sse(again.text) == events
    # Nothing left to send for a finished run: 204 tells the browser not to reconnect.
    done = await client.http.get(url, headers={"Last-Event-ID": f"{state.epoch}:{state.seq}"})
    assert done.status_code == 204


async def test_stale_position_gets_one_reset_with_the_current_reply(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(model=ScriptedModel([NUMBERS]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "count")
    await client.wait_idle(chat_id)
    state = client.web.runs.latest(chat_id)
    assert state is not None
    url = f"/chats/{chat_id}/runs/{state.run_id}/events"
    for stale in ("an-old-process.1:12", "garbage", None):
        headers = {"Last-Event-ID": stale} if stale else {}
        events = parse_sse((await client.http.get(url, headers=headers)).text)
        assert [e.event for e in events] == ["reset"]
        reply = parse_html(events[0].data).find(data_role="assistant")
        assert reply.attrs["data-run-id"] == state.run_id
        assert " ".join(reply.find(class_="content").text().split()) == NUMBERS


async def test_a_run_from_before_a_restart_streams_its_stored_reply(
    web_client_factory: MakeClient, tmp_path: Path
):
    first = await web_client_factory(model=ScriptedModel(["stored words"]))
    chat_id = await first.new_chat()
    await first.send(chat_id, "hi")
    await first.wait_idle(chat_id)
    run_id = (await first.web.session.segments(chat_id))[0].run_id
    second = await web_client_factory(model=ScriptedModel([]))  # same file, new process state
    response = await second.http.get(
        f"/chats/{chat_id}/runs/{run_id}/events", headers={"Last-Event-ID": "old.1:3"}
    )
    events = parse_sse(response.text)
    assert [e.event for e in events] == ["done"]
    reply = parse_html(events[0].data).find(data_role="assistant")
    assert reply.find(class_="content").norm_text() == "stored words"


async def test_live_stream_survives_a_reload_and_a_dropped_connection(tmp_path: Path):
    app = create_app(tmp_path / "chat.db", model=ScriptedModel([NUMBERS], chunk_delay=0.03))
    async with serve(app) as base, httpx.AsyncClient(base_url=base, timeout=10) as http:
        created = await http.post("/chats")
        chat_id = created.headers["location"].rsplit("/", 1)[1]
        await http.post(f"/chats/{chat_id}/messages", data={"text": "count"})
        await asyncio.sleep(0.3)
        # A reload mid-stream: the page shows the reply as it is at position N ...
        page = parse_html((await http.get(f"/chats/{chat_id}")).text)
        reply = replies(page)[0]
        assert reply.attrs["data-status"] == "streaming"
        shown = reply.find(class_="content").text()
        assert shown and NUMBERS.startswith(shown) and shown != NUMBERS
        connect = reply.attrs["sse-connect"] or ""
        # ... and its stream continues from N: a few events, then the connection drops ...
        first = await read_events(http, connect, {}, limit=3)
        assert [e.event for e in first] == ["text"] * 3
        # ... and the browser reconnects with Last-Event-ID, up to the final reply.
        rest = await read_events(http, connect, {"Last-Event-ID": first[-1].id or ""}, None)
        assert rest[-1].event == "done"
        streamed = shown + text_of_fragments(first) + text_of_fragments(rest)
        assert streamed == NUMBERS  # no gap, no duplicate
        ids = [int((e.id or "x:0").rsplit(":", 1)[1]) for e in first + rest]
        assert ids == sorted(set(ids))
        # A second tab from the start of the log sees everything exactly once, too.
        state = app.state.web.runs.latest(chat_id)
        tab = await read_events(http, connect, {"Last-Event-ID": f"{state.epoch}:0"}, None)
        assert text_of_fragments(tab) == NUMBERS


async def test_a_fast_stream_reaches_clients_as_few_coalesced_events(tmp_path: Path):
    words = " ".join(str(i) for i in range(1, 301))
    app = create_app(tmp_path / "chat.db", model=ScriptedModel([words], chunk_delay=0.001))
    async with serve(app) as base, httpx.AsyncClient(base_url=base, timeout=10) as http:
        chat_id = (await http.post("/chats")).headers["location"].rsplit("/", 1)[1]
        await http.post(f"/chats/{chat_id}/messages", data={"text": "fast"})
        state = app.state.web.runs.latest(chat_id)
        url = f"/chats/{chat_id}/runs/{state.run_id}/events"
        clients = [
            read_events(http, url, {"Last-Event-ID": f"{state.epoch}:0"}, None) for _ in range(5)
        ]
        for events in await asyncio.gather(*clients):
            assert text_of_fragments(events) == words
            # 300 deltas and a final reply, in far fewer events than log records.
            assert len(events) < 100, len(events)
        assert state.seq == 301


async def test_reset_of_a_running_reply_continues_from_the_current_position(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(model=ScriptedModel([NUMBERS], chunk_delay=0.02))
    chat_id = await client.new_chat()
    await client.send(chat_id, "count")
    await client.wait_text(chat_id, 10)
    state = client.web.runs.latest(chat_id)
    assert state is not None
    url = f"/chats/{chat_id}/runs/{state.run_id}/events"
    response = await client.http.get(url, headers={"Last-Event-ID": "process-before-restart.1:40"})
    (reset,) = parse_sse(response.text)
    assert reset.event == "reset"
    epoch, seq = parse_position(reset.id)
    assert epoch == state.epoch and 0 < seq <= state.seq
    reply = parse_html(reset.data).find(data_role="assistant")
    assert reply.attrs["data-status"] == "streaming"
    # The replacement reply shows the text up to that position and streams on from it.
    shown = reply.find(class_="content").text()
    expected = "".join(parse_html(r.data).text() for r in state.records[:seq])
    assert shown == expected
    assert (reply.attrs["sse-connect"] or "").endswith(f"after={epoch}%3A{seq}")
    await client.wait_idle(chat_id)


# --- batching: the first event at once, then at most one batch per window -------------


class GatedModel:
    """Streams ``words`` once ``gate`` opens, so a test knows when the first delta comes."""

    def __init__(self, words: list[str]) -> None:
        self.words = words
        self.gate = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        await self.gate.wait()
        for word in self.words:
            yield TextPart(word)
        yield FinishPart("stop")


async def timed_events(http: httpx.AsyncClient, url: str) -> list[tuple[float, SSEvent]]:
    """A stream's events to its ``done``, each with the loop time it arrived at."""
    loop = asyncio.get_running_loop()
    out: list[tuple[float, SSEvent]] = []
    buffer = ""
    async with http.stream("GET", url) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_text():
            buffer += chunk.replace("\r\n", "\n")
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                out += [(loop.time(), event) for event in parse_sse(block + "\n\n")]
                if out and out[-1][1].event == "done":
                    return out
    return out


async def sent(http: httpx.AsyncClient, app: Starlette, text: str) -> RunState:
    """The run of ``text``, sent as a form (no JavaScript) in a new chat."""
    chat_id = (await http.post("/chats")).headers["location"].rsplit("/", 1)[1]
    await http.post(f"/chats/{chat_id}/messages", data={"text": text})
    state: RunState = app.state.web.runs.latest(chat_id)
    return state


def events_url(state: RunState) -> str:
    """The run's event stream from its start."""
    return f"/chats/{state.chat_id}/runs/{state.run_id}/events?after={state.epoch}:0"


async def test_the_first_text_event_does_not_wait_for_the_batch_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(sse, "BATCH_WINDOW", 0.5)  # long, so a wait could not hide
    model = GatedModel(["Hello", " there"])
    app = create_app(tmp_path / "chat.db", model=model)
    loop = asyncio.get_running_loop()
    async with serve(app) as base, httpx.AsyncClient(base_url=base, timeout=10) as http:
        state = await sent(http, app, "hi")
        reading = asyncio.create_task(timed_events(http, events_url(state)))
        await asyncio.sleep(0.2)  # the stream is open and waiting for the log
        assert state.seq == 0
        opened = loop.time()
        model.gate.set()
        events = await reading
    arrived, first = events[0]
    assert first.event == "text"
    assert arrived - opened < 0.1, f"the first token took {arrived - opened:.3f} s"
    assert text_of_fragments([e for _, e in events]) == "Hello there"
    assert events[-1][1].event == "done"


async def test_after_the_first_event_deltas_go_out_once_per_window(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(sse, "BATCH_WINDOW", 0.3)
    state = RunState("chat", "run", "e.1", "hi", ReplyView("run"))
    events = sse.stream(cast(RunManager, NoManager()), state, "e.1", 0)
    loop = asyncio.get_running_loop()

    async def next_event() -> tuple[float, SSEvent]:
        raw = await asyncio.wait_for(anext(events), 5)
        (event,) = parse_sse(raw.decode())
        return loop.time(), event

    waiting = asyncio.create_task(next_event())
    await asyncio.sleep(0.05)
    appended = loop.time()
    state.append(TEXT, "a")
    sent, event = await waiting
    assert (event.data, event.id) == ("a", "e.1:1")
    assert sent - appended < 0.1  # the first at once
    state.append(TEXT, "b")
    await asyncio.sleep(0.05)
    state.append(TEXT, "c")
    later, event = await next_event()
    assert (event.data, event.id) == ("bc", "e.1:3")  # one event for the window
    assert later - sent >= 0.25
    await asyncio.sleep(0.4)  # quiet for longer than a window
    appended = loop.time()
    state.append(TEXT, "d")
    sent, event = await next_event()
    assert (event.data, event.id) == ("d", "e.1:4")
    assert sent - appended < 0.1  # at once again
    state.phase.finish()
    state.append(DONE, "D")
    _, event = await next_event()
    assert (event.event, event.id) == ("done", "e.1:5")
    with pytest.raises(StopAsyncIteration):
        await anext(events)


async def test_a_burst_of_records_wakes_every_waiting_reader_once():
    state = RunState("chat", "run", "e.1", "hi", ReplyView("run"))
    readers = [asyncio.create_task(state.wait_beyond(0, 5)) for _ in range(3)]
    leaver = asyncio.create_task(state.wait_beyond(0, 5))
    await asyncio.sleep(0)
    leaver.cancel()  # a client that went away wakes nobody and is not woken
    for n in range(100):
        state.append(TEXT, str(n))
    done, _ = await asyncio.wait(readers, timeout=1)
    assert len(done) == 3 and leaver.cancelled()
    await asyncio.wait_for(state.wait_beyond(0, 5), 0.1)  # the log is longer: no wait
    start = asyncio.get_running_loop().time()
    await state.wait_beyond(100, 0.05)  # nothing new: returns at the timeout
    assert asyncio.get_running_loop().time() - start >= 0.04


async def test_a_waiting_reader_runs_in_the_very_next_turn_after_an_append():
    # A turn of the loop can hold a slice of a model's burst (milliseconds): a wake-up
    # put off to the next turn would make the reader a whole turn later still.
    state = RunState("chat", "run", "e.1", "hi", ReplyView("run"))
    reader = asyncio.create_task(state.wait_beyond(0, 5))
    await asyncio.sleep(0)
    assert not reader.done()
    state.append(TEXT, "a")
    await asyncio.sleep(0)  # one turn
    assert reader.done()


def test_encoded_events_read_back_as_sent():
    for data in ["<span>a</span>", "a\nb\r\nc\rd", "", "\n", "é 😀", "x\r\n"]:
        for retry in (None, 1000):
            raw = sse.encode("text", data, "e.1:5", retry)
            assert raw.endswith(b"\r\n\r\n") and raw.count(b"\r\n\r\n") == 1  # one event
            [event] = parse_sse(raw.decode())
            # a reader sees every line break as one: the fragment's HTML is unchanged
            assert (event.event, event.id) == ("text", "e.1:5")
            assert event.data == data.replace("\r\n", "\n").replace("\r", "\n")
            assert (b"\r\nretry: 1000\r\n" in raw) == (retry is not None)


async def test_a_stored_reply_is_one_event_without_a_position():
    [raw] = [chunk async for chunk in sse.once(DONE, "<p>x</p>")]
    [stored] = parse_sse(raw.decode())
    assert (stored.event, stored.data, stored.id) == (DONE, "<p>x</p>", None)
    assert b"retry: 1000" in raw


async def test_a_quiet_stream_sends_a_ping_comment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sse, "PING_SECONDS", 0.05)
    state = RunState("c", "r", "e.1", "hi", ReplyView("r"))
    state.append(TEXT, "<span>a</span>")
    events = sse.stream(cast(RunManager, NoManager()), state, "e.1", 0)
    assert b"event: text" in await anext(events)
    assert await asyncio.wait_for(anext(events), 1) == sse.PING  # nothing new for a while
    state.append(TEXT, "<span>b</span>")
    assert b"<span>b</span>" in await asyncio.wait_for(anext(events), 1)
    await events.aclose()


# --- the response: sse-starlette's EventSourceResponse over the encoded events ---------

GET = {"type": "http", "method": "GET", "headers": []}


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


def bodies(sent: list[dict[str, Any]]) -> list[tuple[bytes, bool]]:
    return [(m["body"], m["more_body"]) for m in sent if m["type"] == "http.response.body"]


async def test_each_encoded_event_is_sent_unchanged_then_the_body_ends():
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    chunks = [sse.encode(TEXT, "<b>a</b>\nb", "e.1:1", sse.RETRY_MS), sse.PING]
    events = Events(chunks, then_end=True)
    await asyncio.wait_for(sse.response(events())(GET, quiet_receive, send), 2)
    start = sent[0]
    headers = dict(start["headers"])
    assert start["status"] == 200
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert headers[b"cache-control"] == b"no-store"
    assert headers[b"x-accel-buffering"] == b"no"  # a proxy must not hold events back
    assert bodies(sent) == [(chunks[0], True), (chunks[1], True), (b"", False)]
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
    await asyncio.wait_for(sse.response(events())(GET, receive, send), 2)
    assert events.closed


async def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setattr(sse, "SEND_TIMEOUT", 0.2)
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])
            if len(sent) == 2:
                await asyncio.Event().wait()  # the socket is full: this send never returns

    events = Events([b"a", b"b", b"c"])
    loop = asyncio.get_running_loop()
    start = loop.time()
    caplog.set_level("INFO", logger="webapp.web.sse")
    # Returns, without an error: a stuck client is routine, not a failure of the app.
    await asyncio.wait_for(sse.response(events())(GET, quiet_receive, send), 2)
    assert 0.2 <= loop.time() - start < 1.5
    assert sent == [b"a", b"b"] and events.closed
    assert "took no data" in caplog.text


async def test_a_slow_reader_within_the_send_timeout_is_kept(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sse, "SEND_TIMEOUT", 0.2)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            await asyncio.sleep(0.05)  # slow, but it reads
        sent.append(message)

    events = Events([b"a", b"b", b"c"], then_end=True)
    await asyncio.wait_for(sse.response(events())(GET, quiet_receive, send), 2)
    assert bodies(sent) == [(b"a", True), (b"b", True), (b"c", True), (b"", False)]


async def test_a_server_shutting_down_ends_a_quiet_live_stream_cleanly(
    monkeypatch: pytest.MonkeyPatch,
):
    state = RunState("c", "r", "e.1", "hi", ReplyView("r"))
    state.append(TEXT, "<span>a</span>")
    sent: list[dict[str, Any]] = []
    streaming = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            streaming.set()

    shutdown = anyio.Event()
    events = sse.stream(cast(RunManager, NoManager()), state, "e.1", 0, shutdown)
    response = asyncio.ensure_future(sse.response(events, shutdown)(GET, quiet_receive, send))
    await asyncio.wait_for(streaming.wait(), 2)  # live, and now waiting for more (15 s ping)
    loop = asyncio.get_running_loop()
    began = loop.time()
    # What sse-starlette's signal handling sets when uvicorn begins to shut down.
    monkeypatch.setattr(AppStatus, "should_exit", True)
    await asyncio.wait_for(response, 3)
    assert loop.time() - began < 1.5  # its watcher looks twice a second
    assert shutdown.is_set() and not state.finished
    # The body ends properly: the browser's EventSource reconnects, it does not see an error.
    [(first, _), end] = bodies(sent)
    assert b"<span>a</span>" in first and end == (b"", False)


class NoManager:
    """A run manager whose only part `sse.stream` uses here is its readers."""

    def __init__(self) -> None:
        self.readers = Readers(lambda state: None)
