"""Continuing an unfinished reply, and the finish_reason a segment's meta records."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from webapp import (
    Agent,
    CheckpointOptions,
    ContextPolicy,
    FileResultStore,
    InMemoryCheckpointer,
    InMemorySession,
    RunHead,
    Runner,
    tool,
)
from webapp.events import RunCancelled, RunCompleted, RunStarted, TextDelta
from webapp.models import ScriptedModel
from webapp.models.scripted import CutOff
from webapp.runtime.continuation import continues_final, segment_meta
from webapp.transcript import AssistantEntry, ToolCallEntry, ToolResultEntry, UserEntry

STOPPED = [UserEntry("count to 10"), AssistantEntry("1 2 3")]


@tool
def shout(word: str) -> str:
    """Return the word in capitals."""
    return word.upper()


class SpyCheckpointer(InMemoryCheckpointer):
    def __init__(self) -> None:
        super().__init__()
        self.saves: list[tuple[list, RunHead]] = []

    async def append(self, run_id, entries, head):
        self.saves.append((list(entries), head))
        await super().append(run_id, entries, head)


async def stopped_session(stores, meta=None) -> None:
    await stores.session.append("chat", STOPPED, run_id="r1", meta=meta or {"status": "stopped"})


def continuation_options(checkpointer, run_id: str = "r2") -> CheckpointOptions:
    return CheckpointOptions(checkpointer, run_id, if_run_exists="fail", delete_on_success=True)


async def test_empty_input_after_an_assistant_reply_continues_it(stores):
    await stopped_session(stores)
    model = ScriptedModel([" 4 5 6"])
    handle = Runner.stream(
        Agent("a", model=model),
        [],
        session=stores.session,
        session_id="chat",
        checkpoint=continuation_options(stores.checkpointer),
    )
    events = [event async for event in handle]

    assert isinstance(events[0], RunStarted) and not events[0].resumed
    assert model.requests == [STOPPED]  # ends with the partial reply, nothing added
    assert model.continued == [True]
    result = events[-1].result
    assert result.entries == [AssistantEntry(" 4 5 6")]  # only what this run produced
    assert result.output == " 4 5 6"
    segments = await stores.session.segments("chat")
    assert [(s.run_id, s.entries) for s in segments] == [
        ("r1", STOPPED),
        ("r2", [AssistantEntry(" 4 5 6")]),
    ]
    assert segments[1].meta is None
    assert await stores.checkpointer.load("r2") is None  # delete_on_success


async def test_a_continuation_checkpoints_no_user_entry_first():
    cp = SpyCheckpointer()
    session = InMemorySession()
    await session.append("chat", STOPPED, run_id="r1")
    await Runner.run(
        Agent("a", model=ScriptedModel([" 4"])),
        [],
        session=session,
        session_id="chat",
        checkpoint=CheckpointOptions(cp, "r2"),
    )
    shapes = [([type(e).__name__ for e in entries], head.status) for entries, head in cp.saves]
    assert shapes == [([], "running"), (["AssistantEntry"], "completed")]


async def test_a_reply_saved_in_pieces_is_continued_as_one(stores):
    await stopped_session(stores)
    await stores.session.append("chat", [AssistantEntry(" 4 5")], run_id="r2")
    model = ScriptedModel([" 6"])
    await Runner.run(Agent("a", model=model), [], session=stores.session, session_id="chat")
    assert model.requests == [[*STOPPED, AssistantEntry(" 4 5")]]
    assert model.continued == [True]


async def test_only_the_first_model_call_continues(stores):
    await stopped_session(stores)
    model = ScriptedModel([[("shout", {"word": "go"})], " and done."])
    result = await Runner.run(
        Agent("a", model=model, tools=[shout]), [], session=stores.session, session_id="chat"
    )
    assert model.continued == [True, False]
    assert [type(e).__name__ for e in result.entries] == [
        "ToolCallEntry",
        "ToolResultEntry",
        "AssistantEntry",
    ]


@pytest.mark.parametrize(
    "history",
    [
        [],
        [UserEntry("count to 10")],
        [
            UserEntry("shout go"),
            ToolCallEntry("c1", "shout", '{"word": "go"}'),
            ToolResultEntry("c1", "GO"),
        ],
    ],
    ids=["no-history", "ends-with-user", "ends-with-tool-result"],
)
async def test_empty_input_without_a_final_reply_is_an_ordinary_run(stores, history):
    if history:
        await stores.session.append("chat", history, run_id="r1")
    model = ScriptedModel(["answer"])
    result = await Runner.run(
        Agent("a", model=model), [], session=stores.session, session_id="chat"
    )
    assert model.requests == [history] and model.continued == [False]
    assert result.entries == [AssistantEntry("answer")]


async def test_new_input_after_a_reply_is_not_a_continuation(stores):
    await stopped_session(stores)
    model = ScriptedModel(["ok"])
    await Runner.run(Agent("a", model=model), "next", session=stores.session, session_id="chat")
    assert model.continued == [False]


async def test_a_dangling_call_after_the_reply_is_dropped_and_the_reply_continued(stores):
    dangling = ToolCallEntry("c9", "shout", '{"word": "x"}')
    await stores.session.append("chat", [*STOPPED, dangling], run_id="r1")
    model = ScriptedModel([" 4"])
    await Runner.run(Agent("a", model=model), [], session=stores.session, session_id="chat")
    assert model.requests == [STOPPED] and model.continued == [True]


async def test_a_stopped_continuation_keeps_only_its_own_text_and_resumes_as_one(stores):
    await stopped_session(stores)
    rest = " ".join(str(n) for n in range(4, 200))
    opts = CheckpointOptions(stores.checkpointer, "r2", if_run_exists="fail")
    handle = Runner.stream(
        Agent("a", model=ScriptedModel([" " + rest], chunk_delay=0.002)),
        [],
        session=stores.session,
        session_id="chat",
        checkpoint=opts,
    )
    seen = ""
    async for event in handle:
        if isinstance(event, TextDelta):
            seen += event.text
            if len(seen.split()) == 5:
                handle.cancel()
        last = event
    assert isinstance(last, RunCancelled)
    assert last.entries == [AssistantEntry(seen)]  # no user entry, no history
    snapshot = await stores.checkpointer.load("r2")
    assert snapshot.status == "interrupted" and snapshot.entries == []

    # a re-submission resumes it, still as a continuation of the same reply, and goes
    # on from the text it had streamed: one assistant message, the saved text in it once
    model = ScriptedModel([" 42 43"])
    resume = CheckpointOptions(stores.checkpointer, "r2", if_run_exists="resume_only")
    events = [
        e
        async for e in Runner.stream(
            Agent("a", model=model),
            [],
            session=stores.session,
            session_id="chat",
            checkpoint=resume,
        )
    ]
    assert isinstance(events[0], RunStarted) and events[0].resumed
    assert model.requests == [[STOPPED[0], AssistantEntry("1 2 3" + seen)]]
    assert model.continued == [True]
    assert isinstance(events[-1], RunCompleted)
    assert events[-1].result.entries == [AssistantEntry(seen + " 42 43")]


async def test_a_reply_cut_by_the_output_limit_is_recorded_in_the_segment_meta(stores):
    model = ScriptedModel([CutOff("1 2 3"), " 4 5"])
    agent = Agent("a", model=model)
    cut = await Runner.run(agent, "count to 5", session=stores.session, session_id="chat")
    assert cut.finish_reason == "length"
    done = await Runner.run(agent, [], session=stores.session, session_id="chat")
    assert done.finish_reason == "stop"
    first, second = await stores.session.segments("chat")
    assert first.meta == {"finish_reason": "length"}
    assert second.meta is None  # a normal finish records nothing
    assert model.continued == [False, True]


async def test_finish_reason_is_merged_with_the_context_state(stores, tmp_path):
    policy = ContextPolicy(result_store=FileResultStore(tmp_path / "results"))
    model = ScriptedModel([[("shout", {"word": "hi"})], CutOff("HI and")])
    agent = Agent("a", model=model, tools=[shout], context_policy=policy)
    await Runner.run(agent, "shout hi", session=stores.session, session_id="chat")
    [segment] = await stores.session.segments("chat")
    assert segment.meta == {"context_state": {"archived": 1}, "finish_reason": "length"}


async def test_a_replay_keeps_the_meta_the_first_append_stored(stores):
    opts = CheckpointOptions(stores.checkpointer, "job")
    agent = Agent("a", model=ScriptedModel([CutOff("half")]))
    await Runner.run(agent, "go", session=stores.session, session_id="chat", checkpoint=opts)
    replayed = await Runner.run(
        Agent("a", model=ScriptedModel([])),
        "go",
        session=stores.session,
        session_id="chat",
        checkpoint=opts,
    )
    assert replayed.finish_reason == "length"  # kept in the completed head
    [segment] = await stores.session.segments("chat")
    assert segment.meta == {"finish_reason": "length"}


class DyingSession:
    """The process dies before its first session append: nothing is written."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def append(self, *args: Any, **kwargs: Any) -> str:
        raise OSError("killed between checkpoint completed and session appended")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_cut_reply_replayed_after_a_crash_before_its_append_is_still_cut(stores):
    # Continue is offered on finish_reason "length" alone: a replay that heals the
    # missing append must know it, though the model is not called again.
    opts = CheckpointOptions(stores.checkpointer, "cut-job")
    with pytest.raises(OSError, match="killed"):
        await Runner.run(
            Agent("a", model=ScriptedModel([CutOff("1 2 3")])),
            "count to 10",
            session=DyingSession(stores.session),
            session_id="chat",
            checkpoint=opts,
        )
    assert await stores.session.segments("chat") == []
    snapshot = await stores.checkpointer.load("cut-job")
    assert snapshot.status == "completed" and snapshot.head.finish_reason == "length"
    replayed = await Runner.run(
        Agent("a", model=ScriptedModel([])),  # a model call would fail the replay
        [],
        session=stores.session,
        session_id="chat",
        checkpoint=CheckpointOptions(stores.checkpointer, "cut-job", if_run_exists="resume_only"),
    )
    assert replayed.finish_reason == "length" and replayed.output == "1 2 3"
    [segment] = await stores.session.segments("chat")
    assert segment.meta == {"finish_reason": "length"}


def test_continues_final_only_before_the_run_has_entries_of_its_own():
    reply = AssistantEntry("partial")
    assert continues_final([], [UserEntry("q"), reply])
    assert not continues_final([reply], [UserEntry("q"), reply])
    assert not continues_final([], [UserEntry("q")])
    assert not continues_final([], [])


def test_segment_meta_records_only_a_cut_reply():
    assert segment_meta({}, "stop") is None
    assert segment_meta({}, None) is None
    assert segment_meta({}, "length") == {"finish_reason": "length"}
    state = {"archived": 2}
    meta = segment_meta(state, "tool_calls")
    assert meta == {"context_state": {"archived": 2}}
    assert meta is not None and meta["context_state"] is not state  # a copy, not the head's dict


async def test_scripted_cut_off_ends_with_length():
    model = ScriptedModel([CutOff("a b")])
    result = await asyncio.wait_for(Runner.run(Agent("a", model=model), "x"), timeout=5)
    assert result.output == "a b" and result.finish_reason == "length"
