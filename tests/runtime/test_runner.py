"""The run loop: sessions, tools, events, hooks, guardrails, handoffs, limits."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import logging
import time

import pytest

from webapp import (
    Agent,
    GuardrailTripped,
    RunContext,
    RunHooks,
    Runner,
    UserError,
    tool,
)
from webapp.events import (
    TERMINAL_EVENTS,
    HandoffOccurred,
    RunCompleted,
    RunFailed,
    RunStarted,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnEnded,
)
from webapp.models import ScriptedModel
from webapp.runtime import pacing as pacing_module
from webapp.runtime.model import FinishPart, ModelRequest, TextPart, ToolCallPart
from webapp.transcript import AssistantEntry, ToolCallEntry, ToolResultEntry, UserEntry


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
async def fail_loudly(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"broken on purpose: {reason}")


async def collect(handle) -> list:
    return [event async for event in handle]


async def test_atlas_second_run_sees_first_runs_transcript(stores):
    model = ScriptedModel(["Noted: Atlas.", "Your project is called Atlas."])
    agent = Agent("assistant", model=model)
    await Runner.run(agent, "My project is called Atlas.", session=stores.session, session_id="u1")
    result = await Runner.run(
        agent, "What is my project called?", session=stores.session, session_id="u1"
    )

    assert result.output == "Your project is called Atlas."
    assert model.requests[1] == [
        UserEntry("My project is called Atlas."),
        AssistantEntry("Noted: Atlas."),
        UserEntry("What is my project called?"),
    ]
    segments = await stores.session.segments("u1")
    assert [s.run_id for s in segments][1] == result.run_id
    assert len(segments) == 2


async def test_tool_call_round_trip_events_and_entries(stores):
    model = ScriptedModel([[("add", {"a": 2, "b": 40})], "It is 42."])
    agent = Agent("assistant", model=model, tools=[add])
    events = await collect(Runner.stream(agent, "2+40?", session=stores.session, session_id="s"))

    kinds = [type(e) for e in events]
    assert kinds[0] is RunStarted and kinds[-1] is RunCompleted
    assert kinds.count(RunCompleted) == 1
    call = next(e.call for e in events if isinstance(e, ToolCallStarted))
    finished = next(e.result for e in events if isinstance(e, ToolCallFinished))
    assert (call.name, json.loads(call.arguments)) == ("add", {"a": 2, "b": 40})
    assert finished == ToolResultEntry(call.call_id, "42")
    assert [e.turn for e in events if isinstance(e, TurnEnded)] == [1, 2]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "It is 42."
    result = events[-1].result
    assert result.entries == [UserEntry("2+40?"), call, finished, AssistantEntry("It is 42.")]
    assert result.turns == 2 and result.finish_reason == "stop"
    assert result.usage.output_tokens > 0
    # the second model call saw the tool result
    assert model.requests[1][-1] == finished
    assert (await stores.session.load("s")) == result.entries


async def test_a_raising_tool_becomes_an_error_result_and_the_run_goes_on():
    model = ScriptedModel([[("fail_loudly", {"reason": "disk full"})], "Sorry, it failed."])
    result = await Runner.run(Agent("a", model=model, tools=[fail_loudly]), "try")
    error = result.entries[2]
    assert isinstance(error, ToolResultEntry) and error.is_error
    assert "broken on purpose: disk full" in error.output
    assert result.output == "Sorry, it failed."


async def test_unknown_tool_and_bad_arguments_are_error_results():
    model = ScriptedModel([[("nope", {}), ("add", {"a": "x"})], "ok"])
    result = await Runner.run(Agent("a", model=model, tools=[add]), "go")
    outputs = [e for e in result.entries if isinstance(e, ToolResultEntry)]
    assert outputs[0].is_error and "unknown tool 'nope'" in outputs[0].output
    assert outputs[1].is_error and "b" in outputs[1].output  # missing argument named


async def test_tools_get_run_context_sync_and_async():
    seen = []

    @tool
    def whoami(ctx: RunContext, label: str) -> str:
        """Report the context."""
        seen.append((ctx.run_id, ctx.session_id, ctx.turn, ctx.context, label))
        return "ok"

    @tool
    async def later(ctx: RunContext) -> dict:
        """Async tool."""
        await asyncio.sleep(0)
        return {"turn": ctx.turn}

    model = ScriptedModel([[("whoami", {"label": "x"})], [("later", {})], "done"])
    agent = Agent("a", model=model, tools=[whoami, later])
    result = await Runner.run(agent, "hi", session_id="chat-9", context={"user": 7})
    assert seen == [(result.run_id, "chat-9", 1, {"user": 7}, "x")]
    assert json.loads(result.entries[4].output) == {"turn": 2}


class RepeatingIdModel:
    """A local server that sends call_0 every turn."""

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: ModelRequest):
        self.calls += 1
        if self.calls <= 2:
            yield ToolCallPart("call_0", "add", '{"a": 1, "b": 1}')
            yield FinishPart("tool_calls")
        else:
            yield TextPart("done")


async def test_reused_call_ids_are_rewritten_unique_within_the_session(stores):
    agent = Agent("a", model=RepeatingIdModel(), tools=[add])
    await Runner.run(agent, "one", session=stores.session, session_id="s")
    agent = Agent("a", model=RepeatingIdModel(), tools=[add])
    await Runner.run(agent, "two", session=stores.session, session_id="s")
    entries = await stores.session.load("s")
    ids = [e.call_id for e in entries if isinstance(e, ToolCallEntry)]
    assert len(ids) == 4 and len(set(ids)) == 4
    results = [e.call_id for e in entries if isinstance(e, ToolResultEntry)]
    assert results == ids  # every call still answered by its own result


class Recorder(RunHooks):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def on_run_start(self, ctx):
        self.calls.append("start")

    async def on_tool_start(self, ctx, call):
        self.calls.append(f"tool_start:{call.name}")

    async def on_tool_end(self, ctx, result):
        self.calls.append(f"tool_end:{result.output}")

    async def on_run_end(self, ctx, result):
        self.calls.append(f"end:{result.output}")


async def test_hooks_run_in_order():
    hooks = Recorder()
    model = ScriptedModel([[("add", {"a": 1, "b": 2})], "three"])
    await Runner.run(Agent("a", model=model, tools=[add], hooks=hooks), "1+2")
    assert hooks.calls == ["start", "tool_start:add", "tool_end:3", "end:three"]


async def test_output_guardrail_fails_the_run_and_the_checkpoint(stores):
    from webapp import CheckpointOptions

    async def no_secrets(ctx, output):
        if "secret" in output:
            raise GuardrailTripped("output mentions a secret")

    agent = Agent("a", model=ScriptedModel(["the secret is 1"]), output_guardrails=[no_secrets])
    handle = Runner.stream(agent, "tell", checkpoint=CheckpointOptions(stores.checkpointer, "g1"))
    events = await collect(handle)
    assert isinstance(events[-1], RunFailed)
    assert isinstance(events[-1].error, GuardrailTripped)
    with pytest.raises(GuardrailTripped, match="secret"):
        await handle.result()
    snapshot = await stores.checkpointer.load("g1")
    assert snapshot.status == "failed" and "secret" in snapshot.head.error


async def test_sync_guardrail_that_passes():
    checked = []
    agent = Agent(
        "a", model=ScriptedModel(["fine"]), output_guardrails=[lambda c, o: checked.append(o)]
    )
    assert (await Runner.run(agent, "x")).output == "fine"
    assert checked == ["fine"]


async def test_max_turns_stops_a_tool_loop():
    model = ScriptedModel([[("add", {"a": 1, "b": 1})]] * 5)
    with pytest.raises(UserError, match="max_turns=3"):
        await Runner.run(Agent("a", model=model, tools=[add]), "loop", max_turns=3)
    assert len(model.requests) == 3


async def test_agent_without_model_is_a_user_error():
    with pytest.raises(UserError, match="no model"):
        await Runner.run(Agent("a"), "hi")


async def test_session_without_session_id_is_a_user_error(stores):
    with pytest.raises(UserError, match="session_id"):
        await Runner.run(Agent("a", model=ScriptedModel(["x"])), "hi", session=stores.session)


async def test_model_error_fails_the_run_and_iteration_never_raises():
    boom = ConnectionError("endpoint http://127.0.0.1:9/v1 unreachable")
    handle = Runner.stream(Agent("a", model=ScriptedModel([boom])), "hi")
    events = await collect(handle)
    assert isinstance(events[-1], RunFailed) and events[-1].error is boom
    assert events[-1].entries == [UserEntry("hi")]
    with pytest.raises(ConnectionError):
        await handle.result()


async def test_instructions_callable_sees_context():
    async def instructions(ctx: RunContext) -> str:
        return f"You help user {ctx.context['user']}."

    model = ScriptedModel(["hello"])
    await Runner.run(
        Agent("a", instructions=instructions, model=model), "hi", context={"user": "ada"}
    )
    assert model.systems == ["You help user ada."]


async def test_handoff_switches_agent_instructions_and_model():
    billing_model = ScriptedModel(["Billing here: refund issued."])
    billing = Agent("billing", instructions="You are billing.", model=billing_model)
    triage_model = ScriptedModel([[("transfer_to_billing", {})]])
    triage = Agent("triage", instructions="You triage.", model=triage_model, handoffs=[billing])

    events = await collect(Runner.stream(triage, "refund please"))
    result = events[-1].result
    assert "transfer_to_billing" in triage_model.tools[0]
    assert [(e.from_agent, e.to_agent) for e in events if isinstance(e, HandoffOccurred)] == [
        ("triage", "billing")
    ]
    assert billing_model.systems == ["You are billing."]
    assert result.final_agent is billing and result.output == "Billing here: refund issued."
    # the same conversation continues: billing saw the handoff call and its result
    assert isinstance(billing_model.requests[0][-1], ToolResultEntry)


async def test_usage_adds_up_over_turns():
    model = ScriptedModel([[("add", {"a": 1, "b": 1})], "two words"])
    result = await Runner.run(Agent("a", model=model, tools=[add]), "go")
    assert result.usage.output_tokens == 1 + 2


async def test_input_must_be_text_or_entries():
    with pytest.raises(UserError, match="transcript entries"):
        await Runner.run(Agent("a", model=ScriptedModel(["x"])), ["not an entry"])
    with pytest.raises(UserError, match="string or a list"):
        await Runner.run(Agent("a", model=ScriptedModel(["x"])), 42)


async def test_a_list_of_entries_is_the_runs_input():
    model = ScriptedModel(["ok"])
    result = await Runner.run(Agent("a", model=model), [UserEntry("a"), UserEntry("b")])
    assert model.requests[0] == [UserEntry("a"), UserEntry("b")]
    assert result.entries[:2] == [UserEntry("a"), UserEntry("b")]


class BufferedBurstModel:
    """Parts that are all there already (a model faster than the reader): each costs a
    little CPU and none waits, so nothing in the model ever hands the loop back."""

    def __init__(self, parts: int, cost: float) -> None:
        self.parts, self.cost = parts, cost
        self.made = 0  # parts made so far

    async def stream(self, request: ModelRequest):
        for _ in range(self.parts):
            until = time.perf_counter() + self.cost
            while time.perf_counter() < until:
                pass
            self.made += 1
            yield TextPart("w ")
        yield FinishPart("stop")


async def test_a_burst_of_buffered_parts_does_not_hold_the_event_loop():
    # Counted in parts, not seconds: a busy machine that takes the process off its core
    # stretches every gap, but the parts made between two turns of another task only
    # grow if the run keeps the loop to itself.
    model = BufferedBurstModel(parts=600, cost=0.0002)  # 120 ms of work, never waiting
    made_at_tick: list[int] = []
    running = True

    async def ticker() -> None:
        while running:
            await asyncio.sleep(0)
            made_at_tick.append(model.made)

    ticking = asyncio.create_task(ticker())
    made_at_first_text = None
    async for event in Runner.stream(Agent("a", model=model), "go"):
        if isinstance(event, TextDelta) and made_at_first_text is None:
            made_at_first_text = model.made
    running = False
    await ticking
    # the first text reached the caller at once, not after the whole burst
    assert made_at_first_text == 1
    # and the loop served others all along: slices of a few ms (about 25 parts at
    # 0.2 ms each; more when the OS took the process off its core mid-part, which
    # looks like a model that waited), never most of the burst of 600 in one hold
    gaps = [b - a for a, b in itertools.pairwise(made_at_tick)]
    assert len(made_at_tick) > 10 and max(gaps) < 200, f"{max(gaps)} parts between turns"


def test_a_failed_runs_error_is_handed_over_not_left_for_asyncio_to_log(
    caplog: pytest.LogCaptureFixture,
):
    # The caller gets the failure as RunFailed; asyncio must not also log the task's
    # exception when it goes (its text can hold what the app redacts from users).
    async def fail() -> None:
        model = ScriptedModel([RuntimeError("secret-ish")])
        events = [event async for event in Runner.stream(Agent("a", model=model), "go")]
        assert isinstance(events[-1], RunFailed) and str(events[-1].error) == "secret-ish"

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(fail())
        gc.collect()  # the task goes: asyncio logs an exception nobody retrieved
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


class WatchedModel:
    """Two texts at once; notes whether the caller had the first before the second was read."""

    def __init__(self) -> None:
        self.caller_saw: list[str] = []
        self.seen_when_asked_again: list[str] | None = None

    async def stream(self, request: ModelRequest):
        yield TextPart("first ")
        self.seen_when_asked_again = list(self.caller_saw)
        yield TextPart("second")
        yield FinishPart("stop")


async def test_the_first_text_reaches_the_caller_before_the_next_part_is_read():
    # A burst's next part costs the parsing of many chunks: the first text goes
    # out before that, not after.
    model = WatchedModel()
    async for event in Runner.stream(Agent("a", model=model), "go"):
        if isinstance(event, TextDelta):
            model.caller_saw.append(event.text)
    assert model.caller_saw == ["first ", "second"]
    assert model.seen_when_asked_again == ["first "]


class ClockedBurstModel:
    """Buffered parts, each taking ``step`` seconds on a clock the test controls."""

    def __init__(self, parts: int, step: float) -> None:
        self.parts, self.step = parts, step
        self.now = 0.0
        self.sent = 0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:  # wall-clock stamps stay real
        return time.time()

    async def stream(self, request: ModelRequest):
        for _ in range(self.parts):
            self.now += self.step
            self.sent += 1
            yield TextPart("w ")
        yield FinishPart("stop")


async def test_a_turns_opening_hands_the_loop_back_more_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Right after a send, the send's answer and the page's event stream request
    # still need turns of the loop: a burst in a turn's first 25 ms keeps it for
    # 1 ms at a time, later for 5 ms (fewer, larger batches: less CPU).
    model = ClockedBurstModel(parts=400, step=0.0002)
    monkeypatch.setattr(pacing_module, "time", model)  # the pacing reads this clock
    seen: list[tuple[float, int]] = []  # (clock, parts sent) at each turn the loop gives
    running = True

    async def ticker() -> None:
        while running:
            await asyncio.sleep(0)
            seen.append((model.now, model.sent))

    ticking = asyncio.create_task(ticker())
    await Runner.run(Agent("a", model=model), "go")
    running = False
    await ticking
    batches = [(at, b - a) for (_, a), (at, b) in itertools.pairwise(seen) if b > a]
    opening = [n for at, n in batches if at <= 0.025]
    later = [n for at, n in batches[:-1] if at > 0.03]  # the last batch is the rest
    assert opening and max(opening) <= 6, opening  # 1 ms of 0.2 ms parts, and one more
    assert later and 20 <= min(later) and max(later) <= 26, later


async def test_events_to_hands_each_event_over_in_the_runs_own_task():
    model = ScriptedModel(["one two three"], chunk_delay=0.001)
    handle = Runner.stream(Agent("a", model=model), "count")
    run_task = None
    got: list[tuple[object, bool]] = []

    def sink(event):
        nonlocal run_task
        run_task = run_task or asyncio.current_task()
        got.append((event, asyncio.current_task() is run_task))

    terminal = await handle.events_to(sink)
    assert isinstance(terminal, RunCompleted) and terminal.result.output == "one two three"
    assert run_task is not asyncio.current_task()  # not the caller's: nobody woke per token
    assert all(same for _, same in got[1:])
    texts = [e.text for e, _ in got if isinstance(e, TextDelta)]
    assert "".join(texts) == "one two three" and len(texts) > 1
    assert not any(isinstance(e, TERMINAL_EVENTS) for e, _ in got)


async def test_a_sink_that_raises_fails_the_run_with_its_error():
    handle = Runner.stream(Agent("a", model=ScriptedModel(["hello"])), "hi")
    seen = []

    def sink(event):
        seen.append(event)
        if len(seen) == 2:  # RunStarted, then the first text
            raise RuntimeError("the reader broke")

    terminal = await handle.events_to(sink)
    assert isinstance(terminal, RunFailed) and "the reader broke" in str(terminal.error)
    with pytest.raises(RuntimeError, match="the reader broke"):
        await handle.result()
