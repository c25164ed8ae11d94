"""Checkpointed runs: saves, if_run_exists policies, replay, resume, cancel."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from webapp import Agent, CheckpointOptions, RunContext, RunHead, Runner, UserError, tool
from webapp.events import RunCancelled, RunCompleted, RunStarted, TextDelta
from webapp.models import ScriptedModel
from webapp.stores.checkpoint import InMemoryCheckpointer
from webapp.transcript import AssistantEntry, ToolCallEntry, ToolResultEntry, UserEntry

executions: list[tuple[str, int]] = []


@tool
def record(ctx: RunContext, tag: str) -> str:
    """Record that this tool ran, with its turn number."""
    executions.append((tag, ctx.turn))
    return f"recorded {tag}"


@pytest.fixture(autouse=True)
def _reset():
    executions.clear()


class SpyCheckpointer(InMemoryCheckpointer):
    """Remembers every save so the save points can be asserted."""

    def __init__(self) -> None:
        super().__init__()
        self.saves: list[tuple[list, RunHead]] = []

    async def append(self, run_id, entries, head):
        self.saves.append((list(entries), head))
        await super().append(run_id, entries, head)


async def test_saves_at_start_after_each_model_turn_and_each_tool_result():
    cp = SpyCheckpointer()
    model = ScriptedModel([[("record", {"tag": "a"}), ("record", {"tag": "b"})], "done"])
    await Runner.run(
        Agent("a", model=model, tools=[record]), "go", checkpoint=CheckpointOptions(cp, "r")
    )
    shapes = [
        ([type(e).__name__ for e in entries], head.status, head.turns) for entries, head in cp.saves
    ]
    assert shapes == [
        (["UserEntry"], "running", 0),  # the input's save goes out with the model call
        (["ToolCallEntry", "ToolCallEntry"], "running", 1),
        (["ToolResultEntry"], "running", 1),
        (["ToolResultEntry"], "running", 1),
        (["AssistantEntry"], "completed", 2),  # nothing runs between: one save, completed
    ]
    # append-only: the saves add up to exactly the run's entries, each once
    snapshot = await cp.load("r")
    assert sum(len(entries) for entries, _ in cp.saves) == len(snapshot.entries) == 6
    assert snapshot.head.output == "done"


async def test_a_final_answer_is_saved_before_a_guardrail_runs_on_it():
    cp = SpyCheckpointer()
    checked: list[int] = []

    def guardrail(ctx: RunContext, output: str) -> None:
        checked.append(len(cp.saves))  # saves made when the guardrail runs

    agent = Agent("a", model=ScriptedModel(["done"]), output_guardrails=[guardrail])
    await Runner.run(agent, "go", checkpoint=CheckpointOptions(cp, "g"))
    shapes = [([type(e).__name__ for e in entries], head.status) for entries, head in cp.saves]
    assert shapes == [
        (["UserEntry"], "running"),
        (["AssistantEntry"], "running"),  # durable before the guardrail sees it
        ([], "completed"),
    ]
    assert checked == [2]


async def test_completed_run_replays_without_touching_the_model(stores):
    model = ScriptedModel([[("record", {"tag": "a"})], "answer"])
    agent = Agent("a", model=model, tools=[record])
    opts = CheckpointOptions(stores.checkpointer, "job-1")
    first = await Runner.run(agent, "q", session=stores.session, session_id="s", checkpoint=opts)

    class Hooks:
        calls = 0

    guard_calls = []
    replay_agent = Agent(
        "a",
        model=ScriptedModel([]),  # any model call would raise "ran out of turns"
        tools=[record],
        output_guardrails=[lambda c, o: guard_calls.append(o)],
    )
    events = [
        e
        async for e in Runner.stream(
            replay_agent,
            "new input is ignored",
            session=stores.session,
            session_id="s",
            checkpoint=opts,
        )
    ]
    assert [type(e) for e in events] == [RunCompleted]  # only the terminal event again
    again = events[0].result
    assert again.output == first.output == "answer"
    assert again.usage == first.usage and again.finish_reason == first.finish_reason == "stop"
    assert again.entries == first.entries
    assert guard_calls == [] and executions == [("a", 1)]
    assert len(await stores.session.segments("s")) == 1  # append re-applied, idempotent


async def test_replay_heals_a_crash_between_checkpoint_completed_and_session_append(stores):
    class FlakySession:
        """Fails the first append, as a crash at that point would."""

        def __init__(self, inner):
            self.inner, self.failed = inner, False

        async def append(self, *args, **kwargs):
            if not self.failed:
                self.failed = True
                raise OSError("disk went away")
            return await self.inner.append(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    session = FlakySession(stores.session)
    opts = CheckpointOptions(stores.checkpointer, "heal-1")
    with pytest.raises(OSError, match="disk went away"):
        await Runner.run(
            Agent("a", model=ScriptedModel(["kept"])),
            "q",
            session=session,
            session_id="s",
            checkpoint=opts,
        )
    assert (await stores.checkpointer.load("heal-1")).status == "completed"
    assert await stores.session.segments("s") == []

    result = await Runner.run(
        Agent("a", model=ScriptedModel([])), "q", session=session, session_id="s", checkpoint=opts
    )
    assert result.output == "kept"
    assert await stores.session.load("s") == [UserEntry("q"), AssistantEntry("kept")]


async def test_restart_discards_the_stored_run(stores):
    opts = CheckpointOptions(stores.checkpointer, "r", if_run_exists="restart")
    await Runner.run(Agent("a", model=ScriptedModel(["first"])), "one", checkpoint=opts)
    model = ScriptedModel(["second"])
    result = await Runner.run(Agent("a", model=model), "two", checkpoint=opts)
    assert result.output == "second" and model.requests == [[UserEntry("two")]]
    assert (await stores.checkpointer.load("r")).entries == [
        UserEntry("two"),
        AssistantEntry("second"),
    ]


async def test_fail_policy_refuses_an_existing_run_and_leaves_it_untouched(stores):
    await Runner.run(
        Agent("a", model=ScriptedModel(["x"])),
        "one",
        checkpoint=CheckpointOptions(stores.checkpointer, "r"),
    )
    with pytest.raises(UserError, match="already exists"):
        await Runner.run(
            Agent("a", model=ScriptedModel(["y"])),
            "two",
            checkpoint=CheckpointOptions(stores.checkpointer, "r", if_run_exists="fail"),
        )
    assert (await stores.checkpointer.load("r")).status == "completed"
    # and with nothing stored it simply starts
    out = await Runner.run(
        Agent("a", model=ScriptedModel(["z"])),
        "three",
        checkpoint=CheckpointOptions(stores.checkpointer, "fresh", if_run_exists="fail"),
    )
    assert out.output == "z"


async def test_resume_only_needs_a_stored_run(stores):
    with pytest.raises(UserError, match="no stored run 'ghost'"):
        await Runner.run(
            Agent("a", model=ScriptedModel(["x"])),
            [],
            checkpoint=CheckpointOptions(stores.checkpointer, "ghost", if_run_exists="resume_only"),
        )
    assert await stores.checkpointer.load("ghost") is None


async def test_bad_policy_is_a_user_error():
    with pytest.raises(UserError, match="not a policy"):
        CheckpointOptions(InMemoryCheckpointer(), "r", if_run_exists="sometimes")


async def test_cancel_keeps_partial_text_marks_interrupted_and_resume_finishes(stores):
    words = " ".join(str(i) for i in range(1, 201))
    opts = CheckpointOptions(stores.checkpointer, "c1")
    handle = Runner.stream(
        Agent("a", model=ScriptedModel([words], chunk_delay=0.005)),
        "count",
        session=stores.session,
        session_id="s",
        checkpoint=opts,
    )
    seen = ""
    async for event in handle:
        if isinstance(event, TextDelta):
            seen += event.text
            if len(seen.split()) == 20:
                handle.cancel()
        last = event
    assert isinstance(last, RunCancelled)
    assert last.entries[0] == UserEntry("count")
    assert last.entries[-1] == AssistantEntry(seen)  # exactly what the user saw
    with pytest.raises(asyncio.CancelledError):
        await handle.result()
    snapshot = await stores.checkpointer.load("c1")
    assert snapshot.status == "interrupted"
    assert snapshot.entries == [UserEntry("count")]  # the unfinished turn is not an entry
    assert await stores.session.segments("s") == []  # not written to the session

    # Its streamed text is kept beside the checkpoint (SPEC §6): the resume continues
    # it, as Continue does, instead of redoing the turn.
    rest = words[len(seen) :]
    model = ScriptedModel([rest])
    result = await Runner.run(
        Agent("a", model=model), "ignored", session=stores.session, session_id="s", checkpoint=opts
    )
    assert result.output == words
    # the original input (the new one ignored), then the saved text to continue
    assert model.requests == [[UserEntry("count"), AssistantEntry(seen)]]
    assert model.continued == [True]
    (segment,) = await stores.session.segments("s")
    assert segment.entries == [UserEntry("count"), AssistantEntry(words)]


async def test_cancel_interrupts_a_running_tool_promptly():
    started = asyncio.Event()

    @tool
    async def slow(ctx: RunContext) -> str:
        """Takes a minute."""
        started.set()
        await asyncio.sleep(60)
        return "never"

    cp = InMemoryCheckpointer()
    handle = Runner.stream(
        Agent("a", model=ScriptedModel([[("slow", {})]]), tools=[slow]),
        "go",
        checkpoint=CheckpointOptions(cp, "t"),
    )
    await asyncio.wait_for(started.wait(), 5)
    handle.cancel()
    events = await asyncio.wait_for(_drain(handle), 5)
    cancelled = events[-1]
    assert isinstance(cancelled, RunCancelled)
    assert isinstance(cancelled.entries[-1], ToolCallEntry)  # dangling: the caller drops it
    assert (await cp.load("t")).status == "interrupted"


async def _drain(handle):
    return [e async for e in handle]


async def test_resume_reruns_only_dangling_calls_with_their_turn_number(stores):
    done = ToolCallEntry("c-done", "record", json.dumps({"tag": "done"}))
    dangling = ToolCallEntry("c-dangling", "record", json.dumps({"tag": "again"}))
    head = RunHead(agent_name="a", turns=1)
    await stores.checkpointer.append(
        "crashed",
        [UserEntry("go"), done, dangling, ToolResultEntry("c-done", "recorded done")],
        head,
    )
    model = ScriptedModel(["finished"])
    events = []
    handle = Runner.stream(
        Agent("a", model=model, tools=[record]),
        "ignored",
        session=stores.session,
        session_id="s",
        checkpoint=CheckpointOptions(stores.checkpointer, "crashed"),
    )
    events = [e async for e in handle]
    assert isinstance(events[0], RunStarted) and events[0].resumed
    assert executions == [("again", 1)]  # the finished one never runs again
    result = events[-1].result
    assert result.turns == 2
    assert model.requests[0][-1] == ToolResultEntry("c-dangling", "recorded again")
    assert [s.run_id for s in await stores.session.segments("s")] == ["crashed"]


async def test_resume_from_a_snapshot_the_caller_loaded(stores):
    await stores.checkpointer.append("r9", [UserEntry("hello")], RunHead(agent_name="a"))
    snapshot = await stores.checkpointer.load("r9")
    result = await Runner.run(
        Agent("a", model=ScriptedModel(["hi"])),
        [],
        checkpoint=CheckpointOptions(stores.checkpointer, "r9", resume_from=snapshot),
    )
    assert result.entries == [UserEntry("hello"), AssistantEntry("hi")]


async def test_resume_from_must_match_run_id():
    cp = InMemoryCheckpointer()
    await cp.append("a", [UserEntry("x")], RunHead(agent_name="a"))
    with pytest.raises(UserError, match="snapshot's own run_id"):
        CheckpointOptions(cp, "b", resume_from=await cp.load("a"))


async def test_delete_on_success_removes_the_snapshot(stores):
    opts = CheckpointOptions(stores.checkpointer, "d", delete_on_success=True)
    await Runner.run(
        Agent("a", model=ScriptedModel(["ok"])),
        "go",
        session=stores.session,
        session_id="s",
        checkpoint=opts,
    )
    assert await stores.checkpointer.load("d") is None
    assert await stores.session.load("s") == [UserEntry("go"), AssistantEntry("ok")]


async def test_failed_run_is_resumable(stores):
    opts = CheckpointOptions(stores.checkpointer, "f")
    with pytest.raises(TimeoutError):
        await Runner.run(
            Agent("a", model=ScriptedModel([TimeoutError("slow endpoint")])), "go", checkpoint=opts
        )
    assert (await stores.checkpointer.load("f")).status == "failed"
    result = await Runner.run(Agent("a", model=ScriptedModel(["recovered"])), [], checkpoint=opts)
    assert result.output == "recovered"
    assert (await stores.checkpointer.load("f")).status == "completed"


async def test_resume_reloads_history_and_rerenders_instructions(stores):
    await stores.session.append("s", [UserEntry("earlier"), AssistantEntry("answer")], run_id="old")
    await stores.checkpointer.append("r", [UserEntry("now")], RunHead(agent_name="a"))
    renders = []
    model = ScriptedModel(["done"])
    agent = Agent("a", instructions=lambda ctx: renders.append(ctx.run_id) or "sys", model=model)
    await Runner.run(
        agent,
        [],
        session=stores.session,
        session_id="s",
        checkpoint=CheckpointOptions(stores.checkpointer, "r"),
    )
    assert renders == ["r"]
    assert model.requests[0] == [UserEntry("earlier"), AssistantEntry("answer"), UserEntry("now")]


async def test_resume_through_the_handoff_graph_and_missing_agent(stores, caplog):
    billing = Agent("billing", model=ScriptedModel(["billing resumed"]))
    triage = Agent("triage", model=ScriptedModel([]), handoffs=[billing])
    await stores.checkpointer.append(
        "h", [UserEntry("refund")], RunHead(agent_name="billing", turns=1)
    )
    result = await Runner.run(triage, [], checkpoint=CheckpointOptions(stores.checkpointer, "h"))
    assert result.final_agent is billing and result.output == "billing resumed"

    # an in-flight run whose agent was removed cannot resume
    await stores.checkpointer.append("gone", [UserEntry("x")], RunHead(agent_name="retired"))
    with pytest.raises(UserError, match="retired"):
        await Runner.run(triage, [], checkpoint=CheckpointOptions(stores.checkpointer, "gone"))
    # ...but a completed one still replays, reporting the entry agent
    await stores.checkpointer.append(
        "old",
        [UserEntry("x"), AssistantEntry("y")],
        RunHead(agent_name="retired", status="completed", output="y"),
    )
    with caplog.at_level(logging.WARNING, logger="webapp.runtime"):
        replayed = await Runner.run(
            triage, [], checkpoint=CheckpointOptions(stores.checkpointer, "old")
        )
    assert replayed.output == "y" and replayed.final_agent is triage
    assert "retired" in caplog.text


async def test_two_agents_sharing_a_name_refuse_new_runs_and_resumes(stores):
    # The bug: a resume continued as whichever "billing" the graph walk met first.
    refunds = Agent("billing", model=ScriptedModel(["refunds here"]))
    invoices = Agent("billing", model=ScriptedModel(["invoices here"]))
    sales = Agent("sales", model=ScriptedModel([]), handoffs=[invoices])
    triage = Agent("triage", model=ScriptedModel(["hello"]), handoffs=[refunds, sales])
    models = [a.model for a in (refunds, invoices, sales, triage)]

    with pytest.raises(UserError, match=r"named 'billing'.*unique name"):
        await Runner.run(triage, "hi", checkpoint=CheckpointOptions(stores.checkpointer, "new"))
    assert await stores.checkpointer.load("new") is None  # refused before its first save

    await stores.checkpointer.append("r", [UserEntry("refund")], RunHead("billing", turns=1))
    with pytest.raises(UserError, match=r"named 'billing'.*unique name"):
        await Runner.run(triage, [], checkpoint=CheckpointOptions(stores.checkpointer, "r"))
    stored = await stores.checkpointer.load("r")
    assert stored is not None and stored.status == "running"  # still resumable once fixed
    assert all(m.requests == [] for m in models)


async def test_one_agent_reachable_twice_or_through_a_cycle_is_no_duplicate(stores):
    billing = Agent("billing", model=ScriptedModel(["billing resumed"]))
    sales = Agent("sales", model=ScriptedModel([]), handoffs=[billing])
    triage = Agent("triage", model=ScriptedModel([]), handoffs=[billing, sales])
    billing.handoffs = [triage]  # a cycle back to the entry agent
    await stores.checkpointer.append("r", [UserEntry("refund")], RunHead("billing", turns=1))
    result = await Runner.run(triage, [], checkpoint=CheckpointOptions(stores.checkpointer, "r"))
    assert result.final_agent is billing and result.output == "billing resumed"

    # ...whereas a distinct agent under a name already taken is refused
    sales.handoffs = [billing, Agent("triage")]
    with pytest.raises(UserError, match="named 'triage'"):
        await Runner.run(triage, "hi")


async def test_caller_cancelling_runner_run_cancels_the_run():
    cp = InMemoryCheckpointer()
    words = " ".join(["w"] * 500)
    task = asyncio.create_task(
        Runner.run(
            Agent("a", model=ScriptedModel([words], chunk_delay=0.01)),
            "go",
            checkpoint=CheckpointOptions(cp, "x"),
        )
    )
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(50):
        if (await cp.load("x")).status == "interrupted":
            break
        await asyncio.sleep(0.02)
    assert (await cp.load("x")).status == "interrupted"


class SlowCheckpointer(InMemoryCheckpointer):
    """Each save takes a moment, like a busy disk, so a cancel lands mid-save."""

    async def append(self, run_id, entries, head):
        await asyncio.sleep(0.2)
        await super().append(run_id, entries, head)


async def test_cancel_during_a_save_neither_loses_nor_reorders_it():
    cp = SlowCheckpointer()
    model = ScriptedModel([[("record", {"tag": "x"})], "never"])
    handle = Runner.stream(
        Agent("a", model=model, tools=[record]), "go", checkpoint=CheckpointOptions(cp, "s")
    )
    async for event in handle:
        if isinstance(event, RunStarted):
            # saves: the start's (0-0.2 s, the model call meanwhile), after the model
            # turn (0.2-0.4 s), after the tool result (0.4-0.6 s)
            await asyncio.sleep(0.5)
            handle.cancel()
    snapshot = await cp.load("s")
    assert snapshot.status == "interrupted"  # the interrupt was written last
    assert [type(e).__name__ for e in snapshot.entries] == [
        "UserEntry",
        "ToolCallEntry",
        "ToolResultEntry",
    ]


class GatedCheckpointer(InMemoryCheckpointer):
    """The first save waits for ``release`` (a slow disk), or fails (a broken one)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.release, self.fail, self.calls = asyncio.Event(), fail, 0

    async def append(self, run_id, entries, head):
        self.calls += 1
        if self.calls == 1:
            await self.release.wait()
            if self.fail:
                raise OSError("disk full")
        await super().append(run_id, entries, head)


async def test_the_first_model_request_does_not_wait_for_the_start_save():
    cp = GatedCheckpointer()
    handle = Runner.stream(
        Agent("a", model=ScriptedModel(["hello there"])),
        "go",
        checkpoint=CheckpointOptions(cp, "g"),
    )
    texts = []
    async for event in handle:
        if isinstance(event, TextDelta):
            if not texts:
                assert await cp.load("g") is None  # the model answered while the save waited
                cp.release.set()
            texts.append(event.text)
    assert "".join(texts) == "hello there"
    snapshot = await cp.load("g")  # and the saves kept their order
    assert snapshot.status == "completed"
    assert snapshot.entries == [UserEntry("go"), AssistantEntry("hello there")]


async def test_a_failed_start_save_fails_the_run_at_its_next_save():
    cp = GatedCheckpointer(fail=True)
    cp.release.set()
    with pytest.raises(OSError, match="disk full"):
        await Runner.run(
            Agent("a", model=ScriptedModel(["hello"])), "go", checkpoint=CheckpointOptions(cp, "f")
        )
    snapshot = await cp.load("f")  # the failure is recorded, with what the run had
    assert snapshot.status == "failed" and "disk full" in snapshot.head.error
    assert snapshot.entries == [UserEntry("go"), AssistantEntry("hello")]
