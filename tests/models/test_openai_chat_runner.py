"""OpenAIChatModel driven by the Runner: entries, usage, events and what the server saw."""

from __future__ import annotations

import asyncio

import pytest
from chat_server import API_KEY, ChatServer, Reply, chunk, sse, text_reply, usage_chunk

from webapp import Agent, InMemorySession, Runner
from webapp.errors import ModelError
from webapp.events import (
    ReasoningDelta,
    RunCancelled,
    RunFailed,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from webapp.models import OpenAIChatModel
from webapp.tools import calculator
from webapp.transcript import (
    AssistantEntry,
    ReasoningEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
)
from webapp.usage import Usage


def calculator_call(call_id: str, expression: str) -> Reply:
    arguments = '{"expression": "' + expression + '"}'
    return Reply(
        body=[
            chunk({"role": "assistant", "content": None}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "calculator", "arguments": ""},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[:9]}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[9:]}}]}),
            chunk({}, "tool_calls"),
            usage_chunk(30, 12),
            sse("[DONE]"),
        ]
    )


async def test_a_tool_round_trip_through_the_runner(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script += [
        calculator_call("call_0", "12*(3+4)"),
        text_reply("12*(3+4) ", "is 84.", usage=(50, 5)),
    ]
    agent = Agent("calc", instructions="Use the calculator.", model=chat_model, tools=[calculator])
    handle = Runner.stream(agent, "what is 12*(3+4)?")
    events = []

    async def drain() -> None:
        async for event in handle:
            events.append(event)

    await asyncio.wait_for(drain(), timeout=10)
    result = await handle.result()

    assert result.output == "12*(3+4) is 84."
    assert result.usage == Usage(80, 17)
    assert result.turns == 2
    call = next(e for e in result.entries if isinstance(e, ToolCallEntry))
    assert (call.name, call.arguments) == ("calculator", '{"expression": "12*(3+4)"}')
    assert ToolResultEntry(call.call_id, "84") in result.entries
    assert [type(e) for e in result.entries] == [
        UserEntry,
        ToolCallEntry,
        ToolResultEntry,
        AssistantEntry,
    ]
    # Chunks that arrive together stream as one delta: what counts is that they add up.
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "12*(3+4) is 84."
    assert [type(e) for e in events if isinstance(e, (ToolCallStarted, ToolCallFinished))] == [
        ToolCallStarted,
        ToolCallFinished,
    ]

    first, second = chat_server.received
    assert first.body["messages"] == [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": "what is 12*(3+4)?"},
    ]
    assert [t["function"]["name"] for t in first.body["tools"]] == ["calculator"]
    assert second.body["messages"][2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "12*(3+4)"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "84"},
    ]


async def test_a_reused_call_id_is_rewritten_and_the_next_request_stays_consistent(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    # Some local servers send "call_0" every turn; call ids must stay unique per session.
    session = InMemorySession()
    agent = Agent("calc", model=chat_model, tools=[calculator])
    for expression, answer in (("1+1", "2"), ("2+2", "4")):
        chat_server.script += [calculator_call("call_0", expression), text_reply(answer)]
        await asyncio.wait_for(
            Runner.run(agent, f"what is {expression}", session=session, session_id="s"), 10
        )
    last = chat_server.received[-1].body["messages"]
    call_ids = [c["id"] for m in last if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    tool_ids = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    assert len(call_ids) == 2 and len(set(call_ids)) == 2
    assert tool_ids == call_ids


async def test_an_endpoint_error_fails_the_run_with_a_readable_message(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script.append(
        Reply(status=400, body=['{"error": {"message": "model \'nope\' not found"}}'], headers={})
    )
    agent = Agent("a", model=chat_model)
    handle = Runner.stream(agent, "hi")
    events = []

    async def drain() -> None:
        async for event in handle:
            events.append(event)

    await asyncio.wait_for(drain(), timeout=10)
    failed = events[-1]
    assert isinstance(failed, RunFailed) and isinstance(failed.error, ModelError)
    assert "HTTP 400" in str(failed.error) and "model 'nope' not found" in str(failed.error)
    assert API_KEY not in str(failed.error)
    with pytest.raises(ModelError, match="HTTP 400"):
        await handle.result()


async def test_stop_closes_the_provider_stream_and_keeps_the_partial_text(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script.append(
        Reply(body=[chunk({"content": "Once upon"}), chunk({"content": " a time"})], hold=20)
    )
    handle = Runner.stream(Agent("a", model=chat_model), "tell me a long story")
    streamed = ""

    async def drain() -> RunCancelled | None:
        nonlocal streamed
        async for event in handle:
            if isinstance(event, TextDelta):
                streamed += event.text
                if streamed == "Once upon a time":
                    handle.cancel()
            if isinstance(event, RunCancelled):
                return event
        return None

    cancelled = await asyncio.wait_for(drain(), timeout=10)
    assert cancelled is not None
    assert AssistantEntry("Once upon a time") in cancelled.entries
    assert await asyncio.to_thread(chat_server.disconnected.wait, 5), (
        "the provider never saw the stream closed, so it would keep generating"
    )


async def test_reasoning_streams_as_reasoning_deltas_and_is_not_sent_back(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script += [
        Reply(
            body=[
                chunk({"role": "assistant", "reasoning_content": "The user greets; "}),
                chunk({"reasoning_content": "greet back."}),
                chunk({"content": "Hello!"}),
                chunk({}, "stop"),
                sse("[DONE]"),
            ]
        ),
        text_reply("Still here."),
    ]
    session = InMemorySession()
    agent = Agent("a", model=chat_model)
    handle = Runner.stream(agent, "hi", session=session, session_id="s")
    events = []

    async def drain() -> None:
        async for event in handle:
            events.append(event)

    await asyncio.wait_for(drain(), timeout=10)
    result = await handle.result()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert reasoning == "The user greets; greet back."
    assert ReasoningEntry("The user greets; greet back.") in result.entries
    assert result.output == "Hello!"

    await asyncio.wait_for(Runner.run(agent, "still there?", session=session, session_id="s"), 10)
    assert chat_server.received[1].body["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "still there?"},
    ]
