"""The OpenAI-compatible API (SPEC §16) through the official ``openai`` client: models,
completions and streams, errors, idempotent repeats, resuming, cancel, orphans, store."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from chat_server import ChatServer, Reply, chunk, sse, text_reply, usage_chunk
from conftest import MODEL, serve
from webhelpers import parse_html

USER = [{"role": "user", "content": "Say hello"}]


def slow_reply(pieces: list[str], pause: float, usage: tuple[int, int] = (7, 5)) -> Reply:
    """A reply whose pieces come ``pause`` seconds apart."""
    body: list[str | float] = [chunk({"role": "assistant", "content": ""})]
    for piece in pieces:
        body += [chunk({"content": piece}), pause]
    body += [chunk({}, "stop"), usage_chunk(*usage), sse("[DONE]")]
    return Reply(body=body)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, _upstream: ChatServer) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("api")
    with serve(
        folder / "chat.db", _upstream, "--api-orphan-seconds", "1", log=folder / "server.log"
    ) as (base, _):
        yield base


def client(base: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=30)


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(id, data) of each event of an SSE body."""
    found = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != ":"
        )
        if "data" in fields:
            found.append((fields.get("id"), fields["data"]))
    return found


def content_of(events: list[tuple[str | None, str]]) -> str:
    text = ""
    for _, data in events:
        if data != "[DONE]":
            for choice in json.loads(data).get("choices", []):
                text += choice["delta"].get("content") or ""
    return text


def test_models_are_the_pickers(server: str, upstream: ChatServer):
    listed = client(server).models.list()
    assert [m.id for m in listed.data] == [MODEL]


def test_a_completion_with_its_usage(server: str, upstream: ChatServer):
    upstream.script.append(text_reply("Hello", ", world", usage=(11, 4)))
    answer = client(server).chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, *USER],
        temperature=0.5,
        max_tokens=50,
    )
    assert answer.choices[0].message.content == "Hello, world"
    assert answer.choices[0].finish_reason == "stop"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (11, 4)
    (sent,) = upstream.received
    assert sent.body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent.body["messages"][-1]["content"] == "Say hello"
    assert sent.body["temperature"] == 0.5 and sent.body["max_tokens"] == 50


def test_earlier_messages_go_to_the_model(server: str, upstream: ChatServer):
    upstream.script.append(text_reply("Four"))
    messages = [
        {"role": "user", "content": "What is 1+1?"},
        {"role": "assistant", "content": "Two"},
        {"role": "user", "content": "And 2+2?"},
    ]
    client(server).chat.completions.create(model=MODEL, messages=messages)
    sent = [(m["role"], m["content"]) for m in upstream.received[0].body["messages"][1:]]
    assert sent == [("user", "What is 1+1?"), ("assistant", "Two"), ("user", "And 2+2?")]


def test_a_stream_through_the_sdk(server: str, upstream: ChatServer):
    upstream.script.append(text_reply("One ", "two ", "three", usage=(9, 3)))
    stream = client(server).chat.completions.create(
        model=MODEL, messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "One two three"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert len({c.id for c in chunks}) == 1


def test_every_streamed_event_has_an_id_and_the_run_id_header(server: str, upstream: ChatServer):
    upstream.script.append(text_reply("abc", "de"))
    body = {"model": MODEL, "messages": USER, "stream": True}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=30) as got:
        assert re.fullmatch(r"[0-9a-f]{32}", got.headers["x-run-id"])
        events = sse_events(got.read().decode())
    assert events[-1] == (None, "[DONE]")
    ids = [int(i) for i, _ in events[:-1] if i is not None]
    assert len(ids) == len(events) - 1 and ids == sorted(set(ids))
    assert content_of(events) == "abcde"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"model": "nope/none", "messages": USER}, 404, "model_not_found"),
        ({"model": MODEL, "messages": []}, 422, "invalid_messages"),
        ({"model": MODEL, "messages": USER, "temperature": 9}, 422, "invalid_request"),
        ({"messages": USER}, 422, "missing_model"),
    ],
)
def test_errors_have_openais_shape_and_status(
    server: str, upstream: ChatServer, body: dict[str, object], status: int, code: str
):
    got = httpx.post(server + "/v1/chat/completions", json=body, timeout=10)
    assert got.status_code == status
    error = got.json()["error"]
    assert error["code"] == code and error["message"] and error["type"]
    assert upstream.received == []


def test_the_sdk_raises_its_own_errors(server: str, upstream: ChatServer):
    with pytest.raises(openai.NotFoundError):
        client(server).chat.completions.create(model="nope/none", messages=USER)
    with pytest.raises(openai.UnprocessableEntityError):
        client(server).chat.completions.create(model=MODEL, messages=[])


def test_a_repeat_after_the_end_replays_without_the_model(server: str, upstream: ChatServer):
    upstream.script.append(text_reply("Once", " only", usage=(12, 2)))
    api = client(server)
    headers = {"Idempotency-Key": "after-the-end"}
    first = api.chat.completions.create(model=MODEL, messages=USER, extra_headers=headers)
    again = api.chat.completions.create(model=MODEL, messages=USER, extra_headers=headers)
    assert len(upstream.received) == 1
    assert again.id == first.id
    assert again.choices[0].message.content == first.choices[0].message.content == "Once only"
    assert again.usage == first.usage
    streamed = api.chat.completions.create(
        model=MODEL, messages=USER, extra_headers=headers, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "Once only"
    assert len(upstream.received) == 1


def test_a_repeat_during_the_run_follows_it_from_its_first_event(server: str, upstream: ChatServer):
    upstream.script.append(slow_reply(["a", "b", "c", "d", "e"], 0.3))
    headers = {"Idempotency-Key": "during-the-run"}
    api = client(server)
    first = api.chat.completions.create(
        model=MODEL, messages=USER, extra_headers=headers, stream=True
    )
    seen = [next(first), next(first)]  # the role, then "a"
    second = api.chat.completions.create(
        model=MODEL, messages=USER, extra_headers=headers, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in second if c.choices)
    rest = "".join(c.choices[0].delta.content or "" for c in [*seen, *first] if c.choices)
    assert text == rest == "abcde"
    assert len(upstream.received) == 1


def test_a_different_body_with_the_same_key_is_refused(server: str, upstream: ChatServer):
    upstream.script.append(text_reply("Fine"))
    api = client(server)
    headers = {"Idempotency-Key": "one-body"}
    api.chat.completions.create(model=MODEL, messages=USER, extra_headers=headers)
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "else"}], extra_headers=headers
        )
    assert refused.value.body["code"] == "idempotency_key_reused"  # type: ignore[index]
    assert len(upstream.received) == 1


def test_a_bad_idempotency_key_is_refused(server: str, upstream: ChatServer):
    got = httpx.post(
        server + "/v1/chat/completions",
        json={"model": MODEL, "messages": USER},
        headers={"Idempotency-Key": "x" * 256},
        timeout=10,
    )
    assert got.status_code == 422
    assert got.json()["error"]["code"] == "invalid_idempotency_key"


def test_resume_after_a_disconnect_has_no_gap_and_no_duplicate(server: str, upstream: ChatServer):
    pieces = [f"w{i} " for i in range(12)]
    upstream.script.append(slow_reply(pieces, 0.1))
    body = {"model": MODEL, "messages": USER, "stream": True}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=30) as got:
        run_id = got.headers["x-run-id"]
        head = ""
        for line in got.iter_lines():
            head += line + "\n"
            if line.startswith("data:") and "w2" in line:
                break
    before = sse_events(head + "\n")
    last_id = [i for i, _ in before if i is not None][-1]
    rest = httpx.get(
        f"{server}/v1/runs/{run_id}/events", headers={"Last-Event-ID": last_id}, timeout=30
    )
    after = sse_events(rest.text)
    assert content_of(before) + content_of(after) == "".join(pieces)
    assert after[-1] == (None, "[DONE]")
    assert len(upstream.received) == 1
    # Once ended, the whole stream is still there, and nothing after its last event.
    whole = sse_events(httpx.get(f"{server}/v1/runs/{run_id}/events", timeout=30).text)
    assert content_of(whole) == "".join(pieces)
    end = [i for i, _ in whole if i is not None][-1]
    nothing = httpx.get(
        f"{server}/v1/runs/{run_id}/events", headers={"Last-Event-ID": end}, timeout=30
    )
    assert sse_events(nothing.text) == [(None, "[DONE]")]


def test_cancel_stops_the_run(server: str, upstream: ChatServer):
    upstream.script.append(
        Reply(
            body=[chunk({"role": "assistant", "content": ""}), chunk({"content": "part"})], hold=30
        )
    )
    body = {"model": MODEL, "messages": USER, "stream": True}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=30) as got:
        run_id = got.headers["x-run-id"]
        lines = got.iter_lines()
        while "part" not in next(lines):
            pass
        cancelled = httpx.post(f"{server}/v1/runs/{run_id}/cancel", timeout=30)
        assert cancelled.status_code == 200 and cancelled.json()["content"] == "part"
        rest = "\n".join(lines)
    assert '"finish_reason":"stop"' in rest and rest.rstrip().endswith("data: [DONE]")
    assert upstream.disconnected.wait(5)  # the model's request was given up
    missing = httpx.post(f"{server}/v1/runs/{'0' * 32}/cancel", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "run_not_found"


def test_a_run_every_client_left_is_stopped(server: str, upstream: ChatServer):
    upstream.script.append(
        Reply(body=[chunk({"role": "assistant", "content": ""}), chunk({"content": "so"})], hold=30)
    )
    body = {"model": MODEL, "messages": USER, "stream": True}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=30) as got:
        run_id = got.headers["x-run-id"]
        next(got.iter_lines())
    started = time.monotonic()
    assert upstream.disconnected.wait(15)  # --api-orphan-seconds 1
    assert time.monotonic() - started >= 0.5
    ended = httpx.get(f"{server}/v1/runs/{run_id}/events", timeout=30)
    assert content_of(sse_events(ended.text)) == "so"


def test_a_client_that_stays_keeps_the_run(server: str, upstream: ChatServer):
    upstream.script.append(slow_reply(["x"] * 8, 0.4))  # 3.2 s, past the orphan time
    answer = client(server).chat.completions.create(model=MODEL, messages=USER)
    assert answer.choices[0].message.content == "x" * 8
    assert not upstream.disconnected.is_set()


def test_store_true_makes_a_chat_marked_api(server: str, upstream: ChatServer):
    upstream.script += [text_reply("Kept"), text_reply("Not kept")]
    api = client(server)
    api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Stored question"}],
        extra_body={"store": True},
    )
    api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hidden question"}]
    )
    home = parse_html(httpx.get(server + "/", timeout=10).text)
    listed = {
        a.norm_text(): a for a in home.find_all("a") if "/chats/" in (a.attrs.get("href") or "")
    }
    assert "Stored question API" in listed
    assert not any("Hidden question" in title for title in listed)
    page = parse_html(
        httpx.get(server + listed["Stored question API"].attrs["href"], timeout=10).text
    )
    assert "Kept" in page.norm_text()


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def tool_call_reply(call_id: str, name: str, arguments: str) -> Reply:
    call = {"index": 0, "id": call_id, "type": "function"}
    return Reply(
        body=[
            chunk({"role": "assistant", "content": ""}),
            chunk({"tool_calls": [{**call, "function": {"name": name, "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}),
            chunk({}, "tool_calls"),
            usage_chunk(20, 6),
            sse("[DONE]"),
        ]
    )


def test_a_tool_call_goes_back_to_the_caller_and_its_result_comes_in(
    server: str, upstream: ChatServer
):
    upstream.script += [
        tool_call_reply("call_1", "get_weather", '{"city": "Oslo"}'),
        text_reply("It is sunny in Oslo."),
    ]
    api = client(server)
    asked = [{"role": "user", "content": "Weather in Oslo?"}]
    answer = api.chat.completions.create(model=MODEL, messages=asked, tools=[WEATHER])
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert (call.id, call.function.name) == ("call_1", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    offered = upstream.received[0].body["tools"]
    assert [t["function"]["name"] for t in offered] == ["get_weather"]  # the caller's only
    followed = [
        *asked,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    final = api.chat.completions.create(model=MODEL, messages=followed, tools=[WEATHER])
    assert final.choices[0].message.content == "It is sunny in Oslo."
    sent = upstream.received[1].body["messages"]
    assert sent[-2]["tool_calls"][0]["id"] == "call_1"
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}


def test_a_streamed_tool_call(server: str, upstream: ChatServer):
    upstream.script.append(tool_call_reply("call_9", "get_weather", '{"city": "Rome"}'))
    stream = client(server).chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER], stream=True
    )
    chunks = [c for c in stream if c.choices]
    calls = [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
    assert [(t.id, t.function.name, t.function.arguments) for t in calls] == [
        ("call_9", "get_weather", '{"city": "Rome"}')
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_an_idempotency_key_expires_with_its_hidden_chat(tmp_path: Path, upstream: ChatServer):
    upstream.script += [text_reply("First"), text_reply("Other"), text_reply("Second")]
    db = tmp_path / "chat.db"
    flags = ("--idempotency-hours", "0.0003")  # about a second
    with serve(db, upstream, *flags, log=tmp_path / "server.log") as (base, _):
        api = client(base)
        headers = {"Idempotency-Key": "short-lived"}
        first = api.chat.completions.create(model=MODEL, messages=USER, extra_headers=headers)
        time.sleep(1.5)
        api.chat.completions.create(model=MODEL, messages=USER)  # a start: expired ones go

        def chats() -> int:
            with sqlite3.connect(db) as conn:
                return int(conn.execute("SELECT count(*) FROM chats").fetchone()[0])

        deadline = time.monotonic() + 10
        while chats() != 1:
            assert time.monotonic() < deadline, "the expired hidden chat stayed"
            time.sleep(0.1)
        again = api.chat.completions.create(model=MODEL, messages=USER, extra_headers=headers)
    assert again.id != first.id and again.choices[0].message.content == "Second"
    assert len(upstream.received) == 3
