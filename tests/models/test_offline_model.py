"""OfflineModel: predictable streamed behaviour with no network, alone and in a run."""

from __future__ import annotations

import asyncio
import json
import time

from webapp import Agent, CheckpointOptions, InMemoryCheckpointer, InMemorySession, Runner
from webapp.events import RunCancelled, RunCompleted, TextDelta, ToolCallFinished
from webapp.models import OfflineModel
from webapp.models.offline import find_expression
from webapp.runtime.model import (
    FinishPart,
    ModelPart,
    ModelRequest,
    TextPart,
    ToolCallPart,
    UsagePart,
)
from webapp.tools import calculator, current_time
from webapp.transcript import (
    AssistantEntry,
    Entry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
)

TOOLS = [calculator.spec, current_time.spec]


async def collect(model: OfflineModel, entries: list[Entry], tools=TOOLS) -> list[ModelPart]:
    async def run() -> list[ModelPart]:
        return [p async for p in model.stream(ModelRequest("", entries, list(tools)))]

    return await asyncio.wait_for(run(), timeout=10)


def text_of(parts: list[ModelPart]) -> str:
    return "".join(p.text for p in parts if isinstance(p, TextPart))


async def test_count_to_n_streams_one_number_per_chunk() -> None:
    parts = await collect(OfflineModel(delay=0), [UserEntry("Count to 50")])
    chunks = [p.text for p in parts if isinstance(p, TextPart)]
    assert len(chunks) == 50
    assert "".join(chunks) == " ".join(str(n) for n in range(1, 51))
    assert [c.strip() for c in chunks] == [str(n) for n in range(1, 51)]
    assert isinstance(parts[-2], UsagePart) and parts[-2].usage.output_tokens == 50
    assert parts[-1] == FinishPart("stop")


async def test_count_phrasing_is_case_insensitive_and_bounded() -> None:
    model = OfflineModel(delay=0)
    parts = await collect(model, [UserEntry("please COUNT TO 20 for me")])
    assert text_of(parts) == " ".join(str(n) for n in range(1, 21))
    assert text_of(await collect(model, [UserEntry("count to 10,000")])).endswith(" 9999 10000")
    refused = text_of(await collect(model, [UserEntry("count to 10001")]))
    assert "10,000" in refused and "1 2 3" not in refused


async def test_delay_is_paid_between_chunks() -> None:
    started = time.monotonic()
    await collect(OfflineModel(delay=0.02), [UserEntry("count to 10")])
    assert time.monotonic() - started >= 9 * 0.02


async def test_cancelling_interrupts_the_delay_promptly() -> None:
    model = OfflineModel(delay=5)
    seen: list[str] = []

    async def consume() -> None:
        async for part in model.stream(ModelRequest("", [UserEntry("count to 100")])):
            if isinstance(part, TextPart):
                seen.append(part.text)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    started = time.monotonic()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert done and task.cancelled()
    assert time.monotonic() - started < 1
    assert seen == ["1"]


async def test_arithmetic_asks_the_calculator_then_answers_with_its_result() -> None:
    model = OfflineModel(delay=0)
    first = await collect(model, [UserEntry("what is 12*(3+4)?")])
    calls = [p for p in first if isinstance(p, ToolCallPart)]
    assert len(calls) == 1 and calls[0].name == "calculator"
    assert json.loads(calls[0].arguments) == {"expression": "12*(3+4)"}
    assert first[-1] == FinishPart("tool_calls")
    again = await collect(model, [UserEntry("what is 12*(3+4)?")])
    assert [p.call_id for p in again if isinstance(p, ToolCallPart)] != [calls[0].call_id]

    # The runtime may rewrite the call id; the answer must follow the request's ids.
    history: list[Entry] = [
        UserEntry("what is 12*(3+4)?"),
        ToolCallEntry("renamed-1", "calculator", calls[0].arguments),
        ToolResultEntry("renamed-1", "84"),
    ]
    second = await collect(model, history)
    assert text_of(second) == "12*(3+4) = 84"
    assert not any(isinstance(p, ToolCallPart) for p in second)
    assert second[-1] == FinishPart("stop")


async def test_a_failed_calculation_is_reported() -> None:
    history: list[Entry] = [
        UserEntry("what is 9**9**9"),
        ToolCallEntry("c1", "calculator", '{"expression": "9**9**9"}'),
        ToolResultEntry("c1", "ValueError: 9**387420489 would have about 369,693,105 digits", True),
    ]
    reply = text_of(await collect(OfflineModel(delay=0), history))
    assert reply.startswith("I could not calculate 9**9**9:")
    assert "369,693,105 digits" in reply


async def test_time_question_calls_current_time_then_replies_with_it() -> None:
    model = OfflineModel(delay=0)
    first = await collect(model, [UserEntry("What time is it?")])
    call = next(p for p in first if isinstance(p, ToolCallPart))
    assert (call.name, json.loads(call.arguments)) == ("current_time", {})
    history: list[Entry] = [
        UserEntry("What time is it?"),
        ToolCallEntry(call.call_id, "current_time", call.arguments),
        ToolResultEntry(call.call_id, "2026-01-02T03:04:05+01:00"),
    ]
    assert "2026-01-02T03:04:05+01:00" in text_of(await collect(model, history))


async def test_only_the_last_user_message_counts() -> None:
    history: list[Entry] = [
        UserEntry("what is 2+2"),
        ToolCallEntry("c1", "calculator", '{"expression": "2+2"}'),
        ToolResultEntry("c1", "4"),
        AssistantEntry("2+2 = 4"),
        UserEntry("count to 3"),
    ]
    assert text_of(await collect(OfflineModel(delay=0), history)) == "1 2 3"


async def test_without_the_tools_on_offer_it_answers_directly() -> None:
    parts = await collect(OfflineModel(delay=0), [UserEntry("what is 6*7")], tools=[])
    assert not any(isinstance(p, ToolCallPart) for p in parts)
    assert text_of(parts) == "6*7 = 42"


async def test_anything_else_quotes_the_message_and_explains_how_to_connect() -> None:
    message = "Tell me a story\nabout <b>cats</b>"
    replies = set()
    for _ in range(12):
        reply = text_of(await collect(OfflineModel(delay=0), [UserEntry(message)]))
        assert "> Tell me a story\n> about <b>cats</b>" in reply
        assert "--base-url" in reply and "OPENAI_BASE_URL" in reply and "--model" in reply
        replies.add(reply)
    assert len(replies) > 1, "Regenerate must visibly change the reply"


def test_find_expression_picks_arithmetic_out_of_prose() -> None:
    assert find_expression("what is 12*(3+4)?") == "12*(3+4)"
    assert find_expression("(roughly 2 + 3) please") == "2 + 3"
    assert find_expression("What's (2+3)*4?") == "(2+3)*4"
    assert find_expression("is -5 + 3 negative?") == "-5 + 3"
    assert find_expression("I have 3 apples and 4.5 pears") is None
    assert find_expression("version 1.2.3") is None
    assert find_expression("hello") is None


async def test_through_the_runner_arithmetic_uses_the_real_calculator() -> None:
    agent = Agent("a", model=OfflineModel(delay=0), tools=[calculator, current_time])
    result = await asyncio.wait_for(Runner.run(agent, "what is 12*(3+4)?"), timeout=10)
    assert "84" in result.output
    assert result.output == "12*(3+4) = 84"
    calls = [e for e in result.entries if isinstance(e, ToolCallEntry)]
    results = [e for e in result.entries if isinstance(e, ToolResultEntry)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("calculator", {"expression": "12*(3+4)"})
    ]
    assert [(r.call_id, r.output, r.is_error) for r in results] == [(calls[0].call_id, "84", False)]
    assert result.turns == 2
    assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0


async def test_through_the_runner_a_refused_expression_is_explained() -> None:
    agent = Agent("a", model=OfflineModel(delay=0), tools=[calculator])
    result = await asyncio.wait_for(Runner.run(agent, "what is 9**9**9?"), timeout=10)
    results = [e for e in result.entries if isinstance(e, ToolResultEntry)]
    assert len(results) == 1 and results[0].is_error
    assert result.output.startswith("I could not calculate 9**9**9:")
    assert "digits" in result.output


async def test_through_the_runner_time_and_streamed_events() -> None:
    agent = Agent("a", model=OfflineModel(delay=0), tools=[calculator, current_time])
    handle = Runner.stream(agent, "what time is it?")
    events = []

    async def drain() -> None:
        async for event in handle:
            events.append(event)

    await asyncio.wait_for(drain(), timeout=10)
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert len(finished) == 1 and not finished[0].result.is_error
    assert isinstance(events[-1], RunCompleted)
    assert finished[0].result.output in events[-1].result.output


async def test_through_the_runner_stop_keeps_the_numbers_already_streamed() -> None:
    agent = Agent("a", model=OfflineModel(delay=0.01))
    handle = Runner.stream(agent, "count to 10000")
    streamed = ""

    async def drain() -> RunCancelled | None:
        nonlocal streamed
        async for event in handle:
            if isinstance(event, TextDelta):
                streamed += event.text
                if streamed.count(" ") >= 5:
                    handle.cancel()
            if isinstance(event, RunCancelled):
                return event
        return None

    cancelled = await asyncio.wait_for(drain(), timeout=10)
    assert cancelled is not None
    kept = "".join(e.text for e in cancelled.entries if isinstance(e, AssistantEntry))
    assert kept.startswith("1 2 3 4 5 6")
    assert len(kept.split()) < 100, "the stop must interrupt the stream promptly"


async def continue_reply(entries: list[Entry]) -> list[str]:
    model = OfflineModel(delay=0)
    request = ModelRequest("", entries, list(TOOLS), continue_final=True)
    parts = await asyncio.wait_for(_parts(model, request), timeout=10)
    assert parts[-1] == FinishPart("stop")
    return [p.text for p in parts if isinstance(p, TextPart)]


async def _parts(model: OfflineModel, request: ModelRequest) -> list[ModelPart]:
    return [p async for p in model.stream(request)]


async def test_a_stopped_count_continues_from_the_next_number() -> None:
    chunks = await continue_reply([UserEntry("count to 10"), AssistantEntry("1 2 3")])
    assert chunks == [" 4", " 5", " 6", " 7", " 8", " 9", " 10"]
    assert "1 2 3" + "".join(chunks) == "1 2 3 4 5 6 7 8 9 10"


async def test_a_count_stopped_after_a_space_continues_without_a_gap() -> None:
    chunks = await continue_reply([UserEntry("count to 10"), AssistantEntry("1 2 3 ")])
    assert "".join(chunks) == "4 5 6 7 8 9 10"


async def test_a_count_saved_in_pieces_continues_after_the_last_piece() -> None:
    entries = [UserEntry("count to 6"), AssistantEntry("1 2"), AssistantEntry(" 3 4")]
    assert "".join(await continue_reply(entries)) == " 5 6"


async def test_a_count_in_someone_elses_words_continues_from_its_last_number() -> None:
    chunks = await continue_reply([UserEntry("count to 5"), AssistantEntry("Sure: 1 2 3")])
    assert "".join(chunks) == " 4 5"


async def test_a_finished_count_gets_a_sentence_in_a_new_paragraph() -> None:
    full = " ".join(str(n) for n in range(1, 11))
    chunks = await continue_reply([UserEntry("count to 10"), AssistantEntry(full)])
    text = "".join(chunks)
    assert text.startswith("\n\n") and "nothing to add" in text
    assert not any(ch.isdigit() for ch in text)


async def test_its_own_stopped_reply_goes_on_where_it_stopped() -> None:
    model = OfflineModel(delay=0, seed=3)
    full = text_of(await collect(model, [UserEntry("hello there")]))
    partial = full[:37]
    rest = "".join(await continue_reply([UserEntry("hello there"), AssistantEntry(partial)]))
    assert partial + rest == full


async def test_an_answer_after_a_tool_goes_on_where_it_stopped() -> None:
    entries: list[Entry] = [
        UserEntry("what is 6*7?"),
        ToolCallEntry("c1", "calculator", '{"expression": "6*7"}'),
        ToolResultEntry("c1", "42"),
        AssistantEntry("6*7 ="),
    ]
    assert "".join(await continue_reply(entries)) == " 42"


async def test_a_reply_it_cannot_place_gets_one_short_sentence() -> None:
    chunks = await continue_reply([UserEntry("tell me a story"), AssistantEntry("Once upon")])
    assert "".join(chunks) == (
        "\n\n(That is the whole reply: the offline model has nothing to add to it.)"
    )


async def test_through_the_runner_a_stopped_count_is_continued_in_the_session() -> None:
    session = InMemorySession()
    await session.append("chat", [UserEntry("count to 10"), AssistantEntry("1 2 3")], run_id="r1")
    agent = Agent("a", model=OfflineModel(delay=0))
    events = [
        e
        async for e in Runner.stream(
            agent,
            [],
            session=session,
            session_id="chat",
            checkpoint=CheckpointOptions(
                InMemoryCheckpointer(), "r2", if_run_exists="fail", delete_on_success=True
            ),
        )
    ]
    assert isinstance(events[-1], RunCompleted)
    streamed = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert streamed == " 4 5 6 7 8 9 10"
    assert events[-1].result.entries == [AssistantEntry(" 4 5 6 7 8 9 10")]
    segments = await session.segments("chat")
    assert [s.run_id for s in segments] == ["r1", "r2"]
    reply = "".join(e.text for e in await session.load("chat") if isinstance(e, AssistantEntry))
    assert reply == "1 2 3 4 5 6 7 8 9 10"


# Issue 22: inputs shaped so that a pattern tried at every position rescans the rest of
# the text. Each takes milliseconds now; the quadratic versions took seconds at these
# sizes (30,000 characters; a message may have 100,000: minutes).
HOSTILE_MESSAGES = {
    "whitespace without a digit": "x" + "\n" * 30_000,
    "a long run of opening parentheses": "(" * 30_000,
    "closing parentheses after a number": "1" + ")" * 30_000,
    "signs and spaces": "- " * 15_000 + "x",
}


async def test_a_hostile_message_is_answered_in_bounded_time() -> None:
    model = OfflineModel(delay=0)
    for name, message in HOSTILE_MESSAGES.items():
        start = time.perf_counter()
        parts = await collect(model, [UserEntry(message)])
        assert isinstance(parts[-1], FinishPart), name
        assert time.perf_counter() - start < 0.5, name


def test_find_expression_is_linear_in_whitespace() -> None:
    start = time.perf_counter()
    assert find_expression("x" + "\r\n" * 15_000) is None
    assert find_expression("what is" + " " * 30_000 + "(2 + 3) * 4 ?") == "(2 + 3) * 4"
    assert time.perf_counter() - start < 0.5


async def test_continuing_after_a_long_run_of_digits_or_spaces_is_bounded() -> None:
    for partial in ("1" * 30_000 + "x", "1 2 3" + " " * 30_000, "1" * 5_000):
        start = time.perf_counter()
        words = await continue_reply([UserEntry("count to 10"), AssistantEntry(partial)])
        assert words, partial[:10]
        assert time.perf_counter() - start < 0.5, partial[:10]
    assert await continue_reply([UserEntry("count to 5"), AssistantEntry("1 2" + " " * 9)]) == [
        "3",
        " 4",
        " 5",
    ]
