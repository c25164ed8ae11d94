"""Tools that ask first: a durable pause, decisions recorded before anything runs,
and what a resume does with calls left without a result (SPEC §3, §11).

In-process runs use every store (tests/runtime/conftest.py); the crash tests
kill a worker process (approval_worker.py) on SQLite.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from webapp import (
    Agent,
    CheckpointOptions,
    RunContext,
    RunHead,
    RunHooks,
    Runner,
    SQLiteCheckpointer,
    UserError,
    record_decisions,
    tool,
)
from webapp.events import (
    TERMINAL_EVENTS,
    RunPaused,
    RunStarted,
    ToolCallFinished,
    ToolCallStarted,
)
from webapp.models import ScriptedModel
from webapp.runtime.approvals import DECLINED
from webapp.tools import calculator, current_time
from webapp.transcript import ToolCallEntry, ToolResultEntry, UserEntry, dangling_tool_calls

executions: list[tuple[str, int]] = []


@tool
def note(ctx: RunContext, tag: str) -> str:
    """Note a harmless fact."""
    executions.append((f"note:{tag}", ctx.turn))
    return f"noted {tag}"


@tool(approval="ask", rerunnable=False)
def charge(ctx: RunContext, amount: int) -> str:
    """Charge the customer's card."""
    executions.append((f"charge:{amount}", ctx.turn))
    return f"charged {amount}"


@pytest.fixture(autouse=True)
def _reset():
    executions.clear()


class Recorder(RunHooks):
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def on_tool_start(self, ctx, call):
        self.seen.append(f"tool_start:{call.name}")

    async def on_run_end(self, ctx, result):
        self.seen.append("run_end")


def agent_for(model: ScriptedModel, **kwargs: Any) -> Agent:
    return Agent("clerk", model=model, tools=[note, charge], **kwargs)


async def start_paused(stores, model: ScriptedModel, run_id: str = "pay-1", **kwargs: Any):
    """The first turn calls `note` (allowed) and `charge` (asks): returns the events."""
    handle = Runner.stream(
        agent_for(model, **kwargs),
        "pay the invoice",
        session=stores.session,
        session_id="chat",
        checkpoint=CheckpointOptions(stores.checkpointer, run_id),
    )
    return handle, [e async for e in handle]


async def resume(stores, model: ScriptedModel, run_id: str = "pay-1", **kwargs: Any):
    handle = Runner.stream(
        agent_for(model),
        [],
        session=stores.session,
        session_id="chat",
        checkpoint=CheckpointOptions(stores.checkpointer, run_id, if_run_exists="resume_only"),
        **kwargs,
    )
    return handle, [e async for e in handle]


TWO_CALLS = [("note", {"tag": "invoice"}), ("charge", {"amount": 5})]


async def test_an_ask_tool_pauses_the_run_durably_after_its_allowed_sibling_ran(stores):
    hooks, guarded = Recorder(), []
    model = ScriptedModel([TWO_CALLS])
    handle, events = await start_paused(
        stores, model, hooks=hooks, output_guardrails=[lambda c, o: guarded.append(o)]
    )
    paused = events[-1]
    assert isinstance(paused, RunPaused) and isinstance(paused, TERMINAL_EVENTS)
    [waiting] = paused.pending
    assert waiting.call.name == "charge" and waiting.may_have_run is False
    assert [e.call.name for e in events if isinstance(e, ToolCallStarted)] == ["note"]
    assert executions == [("note:invoice", 1)]  # the allowed call ran, the asking one did not

    result = await handle.result()
    assert result.output == "" and result.interruptions == [waiting]
    assert hooks.seen == ["tool_start:note"] and guarded == []  # no run end, no guardrail
    assert await stores.session.segments("chat") == []  # an unfinished run stays out

    snapshot = await stores.checkpointer.load("pay-1")
    assert snapshot.status == "interrupted"
    assert dangling_tool_calls(snapshot.entries) == [waiting.call]
    assert snapshot.head.pending == [{"call_id": waiting.call.call_id, "may_have_run": False}]
    assert paused.entries == snapshot.entries
    assert len(model.requests) == 1


async def test_allow_runs_the_call_once_and_the_model_continues(stores):
    model = ScriptedModel([TWO_CALLS, "Paid 5."])
    _, events = await start_paused(stores, model)
    call = events[-1].pending[0].call
    assert await record_decisions(stores.checkpointer, "pay-1", {call.call_id: "allow"}) == {
        call.call_id: "allow"
    }
    assert executions == [("note:invoice", 1)]  # recording runs nothing

    handle, events = await resume(stores, model)
    result = await handle.result()
    assert result.output == "Paid 5." and result.interruptions == []
    assert executions == [("note:invoice", 1), ("charge:5", 1)]  # once, with its turn
    assert isinstance(events[0], RunStarted) and events[0].resumed
    assert ToolResultEntry(call.call_id, "charged 5") in model.requests[1]
    assert model.requests[1][0] == UserEntry("pay the invoice")

    snapshot = await stores.checkpointer.load("pay-1")
    assert snapshot.status == "completed" and snapshot.head.pending == []
    assert snapshot.head.decisions == {call.call_id: "allow"}
    [segment] = await stores.session.segments("chat")
    assert segment.entries == snapshot.entries


async def test_deny_gives_the_model_an_error_result_and_it_continues(stores):
    model = ScriptedModel([TWO_CALLS, "I did not charge the card."])
    _, events = await start_paused(stores, model)
    call = events[-1].pending[0].call
    await record_decisions(stores.checkpointer, "pay-1", {call.call_id: "deny"})

    handle, events = await resume(stores, model)
    assert (await handle.result()).output == "I did not charge the card."
    declined = ToolResultEntry(call.call_id, "The user declined to run this tool.", True)
    assert DECLINED == declined.output
    assert model.requests[1][-1] == declined
    assert [e.result for e in events if isinstance(e, ToolCallFinished)] == [declined]
    assert executions == [("note:invoice", 1)]


async def test_a_second_decision_changes_nothing_and_the_call_runs_once(stores):
    model = ScriptedModel([TWO_CALLS, "Paid."])
    _, events = await start_paused(stores, model)
    call_id = events[-1].pending[0].call.call_id
    await record_decisions(stores.checkpointer, "pay-1", {call_id: "allow"})
    # a double click, or a second tab that clicked Deny: the first decision stands
    assert await record_decisions(stores.checkpointer, "pay-1", {call_id: "deny"}) == {
        call_id: "allow"
    }
    await resume(stores, model)
    assert await record_decisions(stores.checkpointer, "pay-1", {call_id: "allow"}) == {
        call_id: "allow"
    }
    handle, _ = await resume(stores, ScriptedModel([]))  # completed: a replay, no model
    assert (await handle.result()).output == "Paid."
    assert [name for name, _ in executions].count("charge:5") == 1


async def test_resuming_without_decisions_pauses_again_without_a_model_call(stores):
    model = ScriptedModel([TWO_CALLS])
    _, first = await start_paused(stores, model)
    handle, events = await resume(stores, model)
    assert [type(e) for e in events] == [RunStarted, RunPaused]
    assert events[-1].pending == first[-1].pending
    assert (await handle.result()).interruptions == first[-1].pending
    assert len(model.requests) == 1 and executions == [("note:invoice", 1)]
    assert (await stores.checkpointer.load("pay-1")).status == "interrupted"


async def test_with_two_waiting_calls_a_resume_applies_the_decisions_it_has(stores):
    model = ScriptedModel(
        [[("charge", {"amount": 1}), ("charge", {"amount": 2})], "Charged one, not two."]
    )
    handle = Runner.stream(
        agent_for(model), "go", checkpoint=CheckpointOptions(stores.checkpointer, "two")
    )
    first, second = [e async for e in handle][-1].pending
    await record_decisions(stores.checkpointer, "two", {first.call.call_id: "allow"})
    _, events = await resume(stores, model, "two")
    assert events[-1].pending == [second] and executions == [("charge:1", 1)]
    assert (await stores.checkpointer.load("two")).head.pending == [
        {"call_id": second.call.call_id, "may_have_run": False}
    ]

    result = await Runner.run(
        agent_for(model),
        [],
        checkpoint=CheckpointOptions(stores.checkpointer, "two", if_run_exists="resume_only"),
        decisions={second.call.call_id: "deny"},  # the shortcut: record, then resume
    )
    assert result.output == "Charged one, not two." and executions == [("charge:1", 1)]
    assert model.requests[1][-2:] == [
        ToolResultEntry(first.call.call_id, "charged 1"),
        ToolResultEntry(second.call.call_id, DECLINED, True),
    ]


async def test_decisions_only_for_calls_that_wait(stores):
    _, events = await start_paused(stores, ScriptedModel([TWO_CALLS]))
    waiting = events[-1].pending[0].call.call_id
    ran = next(e.call.call_id for e in events if isinstance(e, ToolCallStarted))
    with pytest.raises(UserError, match="not waiting for a decision"):
        await record_decisions(stores.checkpointer, "pay-1", {waiting: "allow", ran: "allow"})
    with pytest.raises(UserError, match="not waiting"):
        await record_decisions(stores.checkpointer, "pay-1", {"call_made_up": "deny"})
    with pytest.raises(UserError, match="must be one of"):
        await record_decisions(stores.checkpointer, "pay-1", {waiting: "yes"})
    with pytest.raises(UserError, match="no stored run 'ghost'"):
        await record_decisions(stores.checkpointer, "ghost", {waiting: "allow"})
    with pytest.raises(UserError, match="decisions= resumes a stored run"):
        await Runner.run(agent_for(ScriptedModel([])), [], decisions={waiting: "allow"})
    assert (await stores.checkpointer.load("pay-1")).head.decisions == {}  # all or nothing


async def test_no_decisions_while_the_run_is_running(stores):
    head = RunHead("clerk", pending=[{"call_id": "c1", "may_have_run": False}])
    await stores.checkpointer.append("busy", [UserEntry("go")], head)  # a resume under way
    with pytest.raises(UserError, match="is running"):
        await record_decisions(stores.checkpointer, "busy", {"c1": "allow"})
    assert (await stores.checkpointer.load("busy")).head.decisions == {}


async def test_a_non_rerunnable_call_is_recorded_as_started_before_it_runs(stores):
    seen: list[list[str]] = []

    @tool(rerunnable=False)
    async def send_mail(ctx: RunContext) -> str:
        """Send the mail."""
        seen.append((await stores.checkpointer.load(ctx.run_id)).head.started)
        return "sent"

    model = ScriptedModel([[("send_mail", {})], "Sent."])
    agent = Agent("mailer", model=model, tools=[send_mail])
    result = await Runner.run(
        agent, "mail it", checkpoint=CheckpointOptions(stores.checkpointer, "m")
    )
    call = next(e for e in result.entries if isinstance(e, ToolCallEntry))
    assert result.output == "Sent." and seen == [[call.call_id]]  # allowed: runs at once
    assert (await stores.checkpointer.load("m")).head.started == []


async def test_cancel_after_a_pause_changes_nothing(stores):
    handle, events = await start_paused(stores, ScriptedModel([TWO_CALLS]))
    before = await stores.checkpointer.load("pay-1")
    handle.cancel()
    result = await handle.result()
    assert result.interruptions == events[-1].pending
    assert await stores.checkpointer.load("pay-1") == before


async def test_an_asking_tool_needs_a_checkpoint():
    model = ScriptedModel([])
    with pytest.raises(UserError, match="charge ask for approval"):
        await Runner.run(agent_for(model), "go")
    assert model.requests == []


def test_the_tool_decorator_sets_approval_and_rerunnable():
    assert (charge.approval, charge.rerunnable) == ("ask", False)
    assert (note.approval, note.rerunnable) == ("allow", True)
    for built_in in (calculator, current_time):
        assert (built_in.approval, built_in.rerunnable) == ("allow", True)
    with pytest.raises(ValueError, match="approval must be one of"):
        tool(name="odd", approval="sometimes")(lambda: "x")


def test_a_head_saved_before_approvals_existed_still_loads():
    old = {"agent_name": "a", "status": "interrupted", "turns": 2, "usage": None}
    head = RunHead.from_dict(old)
    assert (head.pending, head.decisions, head.started) == ([], {}, [])
    assert RunHead.from_dict(json.loads(json.dumps(head.to_dict()))) == head


# --- crashes: a worker process killed with SIGKILL ---------------------------------

WORKER = Path(__file__).with_name("approval_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def worker(db: Path, log: Path, step: str, arg: Any = None, hang: str = "") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HANG_IN": hang}
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(db), str(log), step, json.dumps(arg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def run_worker(db: Path, log: Path, step: str, arg: Any = None) -> dict[str, Any]:
    out, err = worker(db, log, step, arg).communicate(timeout=60)
    assert out, err
    return json.loads(out)


def effects(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def kill_when(proc: subprocess.Popen, ready: Any) -> None:
    deadline = time.monotonic() + 30
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the worker never got there"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def stored_head(db: Path) -> RunHead:
    async def read() -> RunHead:
        async with SQLiteCheckpointer(db, wal=True) as cp:
            return (await cp.load("job-7")).head

    return asyncio.run(read())


def decide(db: Path, decisions: dict[str, str]) -> None:
    async def write() -> None:
        async with SQLiteCheckpointer(db, wal=True) as cp:
            await record_decisions(cp, "job-7", decisions)

    asyncio.run(write())


@pytest.mark.slow
def test_a_crash_in_an_allowed_non_rerunnable_call_asks_again_and_never_reruns(tmp_path):
    db, log = tmp_path / "jobs.db", tmp_path / "effects.log"
    paused = run_worker(db, log, "start", [[["charge", {"amount": 5}]]])
    [[call_id, name, may_have_run]] = paused["pending"]
    assert (name, may_have_run) == ("charge", False) and effects(log) == []

    decide(db, {call_id: "allow"})
    proc = worker(db, log, "resume", [], hang="charge")
    kill_when(proc, lambda: effects(log))
    assert stored_head(db).started == [call_id]  # durable before the tool ran

    again = run_worker(db, log, "resume", [])
    assert again["pending"] == [[call_id, "charge", True]] and again["model_calls"] == 0
    assert effects(log) == ["charge:5"]  # not run again by itself
    assert stored_head(db).decisions == {}  # the spent decision is gone: the user decides anew

    decide(db, {call_id: "allow"})  # the user accepts that it may run twice
    done = run_worker(db, log, "resume", ["Charged."])
    assert done["output"] == "Charged." and effects(log) == ["charge:5", "charge:5"]


@pytest.mark.slow
def test_a_crash_in_a_fresh_non_rerunnable_call_pauses_it_as_may_have_run(tmp_path):
    db, log = tmp_path / "jobs.db", tmp_path / "effects.log"
    proc = worker(db, log, "start", [[["transfer", {}]]], hang="transfer")
    kill_when(proc, lambda: effects(log))
    again = run_worker(db, log, "resume", [])
    [[_, name, may_have_run]] = again["pending"]
    assert (name, may_have_run) == ("transfer", True) and effects(log) == ["transfer"]


@pytest.mark.slow
def test_a_crash_in_an_allowed_rerunnable_call_runs_it_again(tmp_path):
    db, log = tmp_path / "jobs.db", tmp_path / "effects.log"
    [[call_id, _, _]] = run_worker(db, log, "start", [[["lookup", {"q": "atlas"}]]])["pending"]
    decide(db, {call_id: "allow"})
    proc = worker(db, log, "resume", [], hang="lookup")
    kill_when(proc, lambda: effects(log))
    done = run_worker(db, log, "resume", ["Found it."])
    assert done["output"] == "Found it." and effects(log) == ["lookup:atlas", "lookup:atlas"]


@pytest.mark.slow
def test_a_kill_between_the_decision_and_the_resume_runs_the_call_exactly_once(tmp_path):
    db, log = tmp_path / "jobs.db", tmp_path / "effects.log"
    [[call_id, _, _]] = run_worker(db, log, "start", [[["charge", {"amount": 9}]]])["pending"]
    proc = worker(db, log, "decide", {call_id: "allow"})
    assert proc.stdout is not None
    kill_when(proc, lambda: proc.stdout.readline().strip() == "recorded")
    assert stored_head(db).decisions == {call_id: "allow"}

    done = run_worker(db, log, "resume", ["Charged 9."])
    assert done["output"] == "Charged 9." and effects(log) == ["charge:9"]
    replay = run_worker(db, log, "resume", [])
    assert replay == {"output": "Charged 9.", "pending": [], "model_calls": 0, "segments": 1}
    assert effects(log) == ["charge:9"]


def test_the_readme_example_runs_as_written(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Tools that ask first\n", 1)[1].split("\n## ", 1)[0]
    script = tmp_path / "ask_first.py"
    script.write_text(section.split("```python\n", 1)[1].split("```", 1)[0])
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    assert out.stdout.splitlines() == [
        'waiting: send_invoice {"customer": "ACME"}',
        "The invoice is on its way.",
    ]
