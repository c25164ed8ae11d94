"""OpenAIChatModel against a real scripted Chat Completions server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import pytest
from chat_server import API_KEY, ChatServer, Reply, chunk, sse, text_reply, usage_chunk

from webapp.errors import ModelError
from webapp.models import OpenAIChatModel
from webapp.models.chat_stream import merged
from webapp.runtime.model import (
    FinishPart,
    ModelPart,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)
from webapp.tools import calculator, current_time
from webapp.transcript import (
    AssistantEntry,
    Entry,
    ReasoningEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
)
from webapp.usage import Usage


async def collect(model: OpenAIChatModel, request: ModelRequest) -> list[ModelPart]:
    async def run() -> list[ModelPart]:
        return [part async for part in model.stream(request)]

    return await asyncio.wait_for(run(), timeout=10)


async def failure(model: OpenAIChatModel, request: ModelRequest) -> ModelError:
    with pytest.raises(ModelError) as caught:
        await collect(model, request)
    message = str(caught.value)
    assert API_KEY not in message and API_KEY not in repr(caught.value)
    return caught.value


def hello() -> ModelRequest:
    return ModelRequest("You are terse.", [UserEntry("Say hello")])


async def test_plain_text_streams_with_usage_and_finish_reason(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script.append(text_reply("Hel", "lo", " world", usage=(12, 3)))
    parts = await collect(chat_model, hello())
    assert merged(parts) == [  # chunks that arrive together come as one part
        TextPart("Hello world"),
        UsagePart(Usage(input_tokens=12, output_tokens=3)),
        FinishPart("stop"),
    ]
    [received] = chat_server.received
    assert received.body == {
        "model": "test-model",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert received.headers["authorization"] == f"Bearer {API_KEY}"
    assert received.headers["accept"] == "text/event-stream"


async def test_no_system_message_and_no_authorization_when_not_configured(
    chat_server: ChatServer,
) -> None:
    chat_server.script.append(text_reply("ok"))
    async with OpenAIChatModel("m", base_url=chat_server.base_url + "/") as model:
        await collect(model, ModelRequest("", [UserEntry("hi")]))
    [received] = chat_server.received
    assert received.body["messages"] == [{"role": "user", "content": "hi"}]
    assert "authorization" not in received.headers


async def test_one_pooled_connection_serves_consecutive_calls(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script += [text_reply("one"), text_reply("two")]
    await collect(chat_model, hello())
    await collect(chat_model, hello())
    first, second = chat_server.received
    assert first.client == second.client, "the second call should reuse the kept-alive connection"


async def test_tool_call_deltas_are_assembled_by_index(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    def call_delta(index: int, **fields: Any) -> str:
        return chunk({"tool_calls": [{"index": index, **fields}]})

    chat_server.script.append(
        Reply(
            body=[
                chunk({"role": "assistant", "content": None}),
                call_delta(
                    0,
                    id="call_a",
                    type="function",
                    function={"name": "calculator", "arguments": ""},
                ),
                call_delta(0, function={"arguments": '{"expr'}),
                call_delta(
                    1,
                    id="call_b",
                    type="function",
                    function={"name": "current_time", "arguments": ""},
                ),
                call_delta(0, function={"arguments": 'ession": "12*'}),
                call_delta(1, function={"arguments": "{}"}),
                call_delta(0, function={"arguments": '(3+4)"}'}),
                chunk({}, "tool_calls"),
                usage_chunk(40, 21),
                sse("[DONE]"),
            ]
        )
    )
    request = ModelRequest(
        "", [UserEntry("what is 12*(3+4)?")], [calculator.spec, current_time.spec]
    )
    parts = await collect(chat_model, request)
    assert parts == [
        ToolCallPart("call_a", "calculator", '{"expression": "12*(3+4)"}'),
        ToolCallPart("call_b", "current_time", "{}"),
        UsagePart(Usage(40, 21)),
        FinishPart("tool_calls"),
    ]
    [received] = chat_server.received
    assert received.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": calculator.description,
                "parameters": calculator.parameters,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "current_time",
                "description": current_time.description,
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]


async def test_reasoning_deltas_become_reasoning_parts(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script.append(
        Reply(
            body=[
                chunk({"role": "assistant", "reasoning_content": "Let me "}),
                chunk({"reasoning_content": "think."}),
                chunk({"reasoning": " Still thinking."}),  # the other field name in use
                chunk({"content": "Answer."}),
                chunk({}, "stop"),
                sse("[DONE]"),
            ]
        )
    )
    parts = await collect(chat_model, hello())
    assert merged(parts) == [
        ReasoningPart("Let me think. Still thinking."),
        TextPart("Answer."),
        FinishPart("stop"),
    ]


async def test_transcript_maps_to_messages_with_tool_calls_and_tool_call_ids(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    entries: list[Entry] = [
        UserEntry("what is 2+2 and the time?"),
        ReasoningEntry("two tools needed"),
        AssistantEntry("Let me check."),
        ToolCallEntry("c1", "calculator", '{"expression": "2+2"}'),
        ToolCallEntry("c2", "current_time", ""),
        ToolResultEntry("c1", "4"),
        ToolResultEntry("c2", "ValueError: clock broken", is_error=True),
        AssistantEntry("2+2 = 4; the clock is broken."),
        UserEntry("and 3+3?"),
        ToolCallEntry("c3", "calculator", '{"expression": "3+3"}'),  # dangling: stopped run
        ToolResultEntry("orphan", "a result whose call is gone"),
        AssistantEntry("(stopped)"),
        UserEntry("try again"),
    ]
    chat_server.script.append(text_reply("6"))
    await collect(chat_model, ModelRequest("sys", entries))
    assert chat_server.received[0].body["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "what is 2+2 and the time?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "current_time", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "tool", "tool_call_id": "c2", "content": "ValueError: clock broken"},
        {"role": "assistant", "content": "2+2 = 4; the clock is broken."},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "(stopped)"},
        {"role": "user", "content": "try again"},
    ]


async def test_http_500_names_status_endpoint_and_provider_text(
    chat_server: ChatServer,
) -> None:
    error = {"error": {"message": "the GPU caught fire", "type": "server_error"}}
    chat_server.script.append(
        Reply(status=500, body=[json.dumps(error)], headers={"content-type": "application/json"})
    )
    model = OpenAIChatModel("m", base_url=chat_server.base_url, api_key=API_KEY, max_retries=0)
    try:
        message = str(await failure(model, hello()))
    finally:
        await model.aclose()
    assert "HTTP 500" in message
    assert f"{chat_server.base_url}/chat/completions" in message
    assert "the GPU caught fire" in message
    assert len(chat_server.received) == 1


async def test_5xx_is_retried_a_bounded_number_of_times(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    for _ in range(5):
        chat_server.script.append(
            Reply(status=503, body=["upstream overloaded"], headers={"content-type": "text/plain"})
        )
    started = time.monotonic()
    message = str(await failure(chat_model, hello()))
    assert len(chat_server.received) == 4, "one call plus max_retries=3 retries"
    assert "HTTP 503" in message and "upstream overloaded" in message
    assert time.monotonic() - started < 3


async def test_429_with_retry_after_then_success(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script += [
        Reply(
            status=429,
            body=['{"error": {"message": "Rate limit reached"}}'],
            headers={"content-type": "application/json", "retry-after": "0"},
        ),
        text_reply("finally"),
    ]
    parts = await collect(chat_model, hello())
    assert [p.text for p in parts if isinstance(p, TextPart)] == ["finally"]
    assert len(chat_server.received) == 2
    assert chat_server.received[0].body == chat_server.received[1].body


async def test_retry_after_is_honoured_and_a_long_one_fails_at_once(
    chat_server: ChatServer,
) -> None:
    chat_server.script += [
        Reply(status=429, body=["slow down"], headers={"retry-after": "0.4"}),
        Reply(status=503, body=["busy"], headers={"retry-after": "3600"}),
        text_reply("never reached"),
    ]
    async with OpenAIChatModel(
        "m", base_url=chat_server.base_url, retry_backoff=0, max_retry_wait=1.0
    ) as model:
        started = time.monotonic()
        message = str(await failure(model, hello()))
        elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < 1.5, elapsed
    assert len(chat_server.received) == 2
    assert "HTTP 503" in message and "asked to wait 3600 s" in message


async def test_without_retry_after_the_backoff_grows_and_is_capped(
    chat_server: ChatServer,
) -> None:
    chat_server.script += [Reply(status=502, body=["bad gateway"], headers={}) for _ in range(3)]
    chat_server.script.append(text_reply("ok"))
    async with OpenAIChatModel(
        "m", base_url=chat_server.base_url, retry_backoff=0.1, max_retry_wait=0.25
    ) as model:
        started = time.monotonic()
        parts = await collect(model, hello())
        elapsed = time.monotonic() - started
    assert TextPart("ok") in parts
    assert 0.1 + 0.2 + 0.25 <= elapsed < 2, elapsed  # 0.1, 0.2, then 0.4 capped to 0.25


async def test_a_closing_chunk_without_delta_is_accepted(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script.append(
        Reply(
            body=[
                chunk({"content": "hi"}),
                sse({"choices": [{"index": 0, "finish_reason": "length"}]}),
                sse("[DONE]"),
            ]
        )
    )
    assert await collect(chat_model, hello()) == [TextPart("hi"), FinishPart("length")]


async def test_client_errors_are_not_retried_and_never_leak_the_key(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    echoed = {"error": {"message": f"Incorrect API key provided: {API_KEY}."}}
    chat_server.script.append(
        Reply(status=401, body=[json.dumps(error) for error in [echoed]], headers={})
    )
    message = str(await failure(chat_model, hello()))
    assert "HTTP 401" in message and "Incorrect API key provided: [redacted]" in message
    assert "--api-key" in message
    assert len(chat_server.received) == 1


async def test_a_long_non_json_error_body_is_truncated(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    page = "<html><body>" + "Not Found " * 500 + "</body></html>"
    chat_server.script.append(Reply(status=404, body=[page], headers={"content-type": "text/html"}))
    message = str(await failure(chat_model, hello()))
    assert "HTTP 404" in message and "Not Found" in message
    assert "'test-model'" in message and "--base-url" in message
    assert len(message) < 1000


async def test_a_chunk_that_is_not_json_fails_promptly(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script.append(
        Reply(body=[chunk({"content": "partial"}), "data: {this is not json\n\n"], hold=10)
    )
    parts: list[ModelPart] = []
    started = time.monotonic()
    with pytest.raises(ModelError, match="malformed stream chunk \\(not JSON"):
        async for part in chat_model.stream(hello()):
            parts.append(part)
    assert parts == [TextPart("partial")]
    assert time.monotonic() - started < 3


async def test_a_stream_that_stalls_hits_the_read_timeout(chat_server: ChatServer) -> None:
    chat_server.script.append(Reply(body=[chunk({"content": "thinking"})], hold=10))
    async with OpenAIChatModel(
        "m", base_url=chat_server.base_url, api_key=API_KEY, timeout=0.5
    ) as model:
        started = time.monotonic()
        error = await failure(model, hello())
    assert "stalled" in str(error) and "read timeout" in str(error)
    assert chat_server.base_url in str(error)
    assert time.monotonic() - started < 3


async def test_a_closed_port_is_reported_as_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    async with OpenAIChatModel("m", base_url=url, api_key=API_KEY) as model:
        started = time.monotonic()
        message = str(await failure(model, hello()))
    assert f"{url}/chat/completions" in message and "unreachable" in message
    assert time.monotonic() - started < 3


async def test_an_error_event_mid_stream_fails_the_call(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script.append(
        Reply(body=[chunk({"content": "so"}), sse({"error": {"message": "model crashed"}})])
    )
    message = str(await failure(chat_model, hello()))
    assert "model crashed" in message and "mid-stream" in message


async def test_a_stream_cut_before_the_finish_is_an_error(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script.append(Reply(body=[chunk({"content": "half a sent"})]))
    message = str(await failure(chat_model, hello()))
    assert "ended before the model finished" in message


async def test_a_non_sse_body_is_a_clear_error(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script.append(
        Reply(body=['{"message": {"content": "ndjson"}}\n'], headers={"content-type": "text/plain"})
    )
    message = str(await failure(chat_model, hello()))
    assert "expected Server-Sent Events" in message


async def test_a_server_that_ignores_stream_true_still_works(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    completion = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "whole",
                    "tool_calls": [
                        {
                            "id": "x1",
                            "type": "function",
                            "function": {"name": "calculator", "arguments": '{"expression":"1+1"}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2},
    }
    chat_server.script.append(
        Reply(body=[json.dumps(completion)], headers={"content-type": "application/json"})
    )
    assert await collect(chat_model, hello()) == [
        TextPart("whole"),
        ToolCallPart("x1", "calculator", '{"expression":"1+1"}'),
        UsagePart(Usage(5, 2)),
        FinishPart("tool_calls"),
    ]


async def test_cancelling_the_consumer_closes_the_connection(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script.append(Reply(body=[chunk({"content": "first"})], hold=20))
    first_seen = asyncio.Event()

    async def consume() -> None:
        async for part in chat_model.stream(hello()):
            if isinstance(part, TextPart):
                first_seen.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first_seen.wait(), timeout=5)
    started = time.monotonic()
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    assert task.cancelled()
    saw_disconnect = await asyncio.to_thread(chat_server.disconnected.wait, 5)
    assert saw_disconnect, "the server never saw the client go away"
    assert time.monotonic() - started < 2


def test_constructor_refuses_unusable_settings() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        OpenAIChatModel("m", base_url="localhost:11434/v1")
    with pytest.raises(ValueError, match="non-empty model name"):
        OpenAIChatModel(" ", base_url="http://localhost:11434/v1")
    with pytest.raises(ValueError, match="max_retries"):
        OpenAIChatModel("m", base_url="http://x/v1", max_retries=-1)
    model = OpenAIChatModel("m", base_url="http://u:pw@host:1/v1/chat/completions", api_key=API_KEY)
    assert model.endpoint == "http://u:pw@host:1/v1/chat/completions"
    assert model.public_endpoint == "http://host:1/v1/chat/completions"
    assert API_KEY not in repr(model) and "pw" not in repr(model)
