"""OpenAIChatModel continuing an unfinished reply: prefill, asking, and the fallback between."""

from __future__ import annotations

import asyncio
import json

import pytest
from chat_server import API_KEY, ChatServer, Reply, text_reply

from webapp import Agent, CheckpointOptions, InMemoryCheckpointer, InMemorySession, Runner
from webapp.errors import ModelError
from webapp.models import OpenAIChatModel
from webapp.models.chat_request import CONTINUE_INSTRUCTION
from webapp.runtime.model import ModelPart, ModelRequest, TextPart
from webapp.transcript import AssistantEntry, UserEntry

PARTIAL = [UserEntry("count to 10"), AssistantEntry("1 2 3")]
PARTIAL_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "count to 10"},
    {"role": "assistant", "content": "1 2 3"},
]
ASK = {"role": "user", "content": CONTINUE_INSTRUCTION}
PREFILL_FLAGS = ("continue_final_message", "add_generation_prompt")


def continuation() -> ModelRequest:
    return ModelRequest("Be brief.", list(PARTIAL), continue_final=True)


async def text(model: OpenAIChatModel, request: ModelRequest) -> str:
    async def run() -> list[ModelPart]:
        return [part async for part in model.stream(request)]

    parts = await asyncio.wait_for(run(), timeout=10)
    return "".join(p.text for p in parts if isinstance(p, TextPart))


def model_for(server: ChatServer, continuation: str = "auto") -> OpenAIChatModel:
    return OpenAIChatModel(
        "test-model",
        base_url=server.base_url,
        api_key=API_KEY,
        timeout=5,
        max_retries=0,
        continuation=continuation,  # type: ignore[arg-type]
    )


def refusal() -> Reply:
    body = json.dumps({"error": {"message": "context too long", "type": "invalid_request_error"}})
    return Reply(status=400, body=[body], headers={"content-type": "application/json"})


async def test_prefill_sends_the_partial_reply_last_with_vllms_flags(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script.append(text_reply(" 4", " 5"))
    assert await text(chat_model, continuation()) == " 4 5"
    [received] = chat_server.received
    assert received.body["messages"] == PARTIAL_MESSAGES
    assert received.body["continue_final_message"] is True
    assert received.body["add_generation_prompt"] is False


async def test_a_refused_prefill_falls_back_to_asking_and_is_remembered(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.refuse_fields.add("continue_final_message")  # as OpenAI does
    chat_server.script += [text_reply(" 4 5"), text_reply(" 6 7")]
    assert await text(chat_model, continuation()) == " 4 5"
    refused, asked = chat_server.received
    assert refused.body["continue_final_message"] is True
    assert asked.body["messages"] == [*PARTIAL_MESSAGES, ASK]
    assert not set(PREFILL_FLAGS) & set(asked.body)

    # the same model instance asks at once next time: one request, no refusal
    chat_server.received.clear()
    assert await text(chat_model, continuation()) == " 6 7"
    [again] = chat_server.received
    assert again.body["messages"] == [*PARTIAL_MESSAGES, ASK]
    assert not set(PREFILL_FLAGS) & set(again.body)


async def test_ordinary_requests_are_unchanged_after_the_fallback(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.refuse_fields.add("continue_final_message")
    chat_server.script += [text_reply(" 4"), text_reply("hi")]
    await text(chat_model, continuation())
    await text(chat_model, ModelRequest("Be brief.", [UserEntry("hello")]))
    plain = chat_server.received[-1].body
    assert plain["messages"][-1] == {"role": "user", "content": "hello"}
    assert not set(PREFILL_FLAGS) & set(plain)


async def test_a_400_that_asking_does_not_cure_fails_and_is_not_remembered(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script += [refusal(), refusal()]
    with pytest.raises(ModelError, match="HTTP 400.*context too long"):
        await text(chat_model, continuation())
    assert [("continue_final_message" in r.body) for r in chat_server.received] == [True, False]

    chat_server.received.clear()
    chat_server.script.append(text_reply(" 4"))
    assert await text(chat_model, continuation()) == " 4"
    [received] = chat_server.received
    assert received.body["continue_final_message"] is True  # prefill is still tried first


async def test_ask_mode_never_sends_the_prefill_flags(chat_server: ChatServer) -> None:
    chat_server.script.append(text_reply(" 4"))
    async with model_for(chat_server, "ask") as model:
        assert await text(model, continuation()) == " 4"
    [received] = chat_server.received
    assert received.body["messages"] == [*PARTIAL_MESSAGES, ASK]
    assert not set(PREFILL_FLAGS) & set(received.body)


async def test_prefill_mode_reports_a_refusal_instead_of_asking(chat_server: ChatServer) -> None:
    chat_server.refuse_fields.add("continue_final_message")
    async with model_for(chat_server, "prefill") as model:
        with pytest.raises(ModelError, match="HTTP 400.*continue_final_message"):
            await text(model, continuation())
    assert len(chat_server.received) == 1


async def test_continue_final_without_a_final_reply_sends_an_ordinary_request(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    chat_server.script.append(text_reply("hi"))
    await text(chat_model, ModelRequest("", [UserEntry("hello")], continue_final=True))
    [received] = chat_server.received
    assert received.body["messages"] == [{"role": "user", "content": "hello"}]
    assert not set(PREFILL_FLAGS) & set(received.body)


def test_an_unknown_continuation_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="continuation must be one of 'auto', 'prefill', 'ask'"):
        OpenAIChatModel("m", base_url="http://127.0.0.1:1/v1", continuation="guess")  # type: ignore[arg-type]


async def test_through_the_runner_a_reply_saved_in_pieces_is_continued_as_one_message(
    chat_server: ChatServer, chat_model: OpenAIChatModel
) -> None:
    session = InMemorySession()
    await session.append("chat", list(PARTIAL), run_id="r1", meta={"status": "stopped"})
    await session.append("chat", [AssistantEntry(" 4 5")], run_id="r2")
    chat_server.refuse_fields.add("continue_final_message")
    chat_server.script.append(text_reply(" 6", " 7"))
    result = await Runner.run(
        Agent("a", instructions="Be brief.", model=chat_model),
        [],
        session=session,
        session_id="chat",
        checkpoint=CheckpointOptions(
            InMemoryCheckpointer(), "r3", if_run_exists="fail", delete_on_success=True
        ),
    )
    assert result.entries == [AssistantEntry(" 6 7")]
    prefill, asked = chat_server.received
    merged = [*PARTIAL_MESSAGES[:2], {"role": "assistant", "content": "1 2 3 4 5"}]
    assert prefill.body["messages"] == merged
    assert asked.body["messages"] == [*merged, ASK]
    assert [s.run_id for s in await session.segments("chat")] == ["r1", "r2", "r3"]
