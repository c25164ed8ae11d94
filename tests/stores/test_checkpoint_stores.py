"""The Checkpointer contract (SPEC §3), checked on every built-in store."""

from __future__ import annotations

import asyncio
from typing import Any

from webapp.stores.checkpoint import Checkpointer, RunHead, RunSnapshot
from webapp.transcript import AssistantEntry, ToolCallEntry, ToolResultEntry, UserEntry
from webapp.usage import Usage


def head(**changes: Any) -> RunHead:
    values: dict[str, Any] = {"agent_name": "main", "started_at": 1.0, "updated_at": 1.0}
    values.update(changes)
    return RunHead(**values)


async def test_is_a_checkpointer(checkpointer: Any) -> None:
    assert isinstance(checkpointer, Checkpointer)


async def test_unknown_run_loads_as_none(checkpointer: Any) -> None:
    assert await checkpointer.load("nope") is None


async def test_entries_accumulate_and_the_head_is_replaced(checkpointer: Any) -> None:
    await checkpointer.append("run", [UserEntry("hi")], head())
    await checkpointer.append(
        "run",
        [ToolCallEntry("c1", "calc", '{"e": "1+1"}')],
        head(turns=1, usage=Usage(input_tokens=5, output_tokens=2)),
    )
    final = head(
        agent_name="helper",
        turns=2,
        status="completed",
        usage=Usage(input_tokens=9, output_tokens=4),
        context_state={"archived": ["c1"], "n": 1},
        output="2",
        session_id="chat-1",
        finish_reason="length",
    )
    await checkpointer.append("run", [ToolResultEntry("c1", "2"), AssistantEntry("2")], final)
    snap = await checkpointer.load("run")
    assert snap == RunSnapshot(
        "run",
        [
            UserEntry("hi"),
            ToolCallEntry("c1", "calc", '{"e": "1+1"}'),
            ToolResultEntry("c1", "2"),
            AssistantEntry("2"),
        ],
        final,
    )
    assert snap.status == "completed"


async def test_a_save_with_no_new_entries_only_replaces_the_head(checkpointer: Any) -> None:
    await checkpointer.append("run", [UserEntry("hi")], head())
    await checkpointer.append("run", [], head(status="interrupted", turns=3))
    snap = await checkpointer.load("run")
    assert snap.entries == [UserEntry("hi")]
    assert (snap.status, snap.head.turns) == ("interrupted", 3)


async def test_runs_are_independent(checkpointer: Any) -> None:
    await checkpointer.append("a", [UserEntry("a")], head(agent_name="x"))
    await checkpointer.append("b", [UserEntry("b")], head(agent_name="y"))
    assert (await checkpointer.load("a")).entries == [UserEntry("a")]
    assert (await checkpointer.load("b")).head.agent_name == "y"


async def test_delete_forgets_the_run_and_a_new_one_starts_fresh(checkpointer: Any) -> None:
    await checkpointer.append("run", [UserEntry("old"), AssistantEntry("old")], head())
    await checkpointer.delete("run")
    await checkpointer.delete("run")
    await checkpointer.delete("never-existed")
    assert await checkpointer.load("run") is None
    await checkpointer.append("run", [UserEntry("new")], head(turns=0))
    assert (await checkpointer.load("run")).entries == [UserEntry("new")]


async def test_loaded_snapshots_are_copies(checkpointer: Any) -> None:
    await checkpointer.append("run", [UserEntry("hi")], head(context_state={"k": [1]}))
    snap = await checkpointer.load("run")
    snap.entries.append(UserEntry("mutated"))
    snap.head.context_state["k"].append(2)
    again = await checkpointer.load("run")
    assert again.entries == [UserEntry("hi")]
    assert again.head.context_state == {"k": [1]}


async def test_many_runs_saved_concurrently(checkpointer: Any) -> None:
    async def run(n: int) -> None:
        for turn in range(8):
            await checkpointer.append(f"run-{n}", [AssistantEntry(f"{n}.{turn}")], head(turns=turn))

    await asyncio.gather(*(run(n) for n in range(25)))
    for n in range(25):
        snap = await checkpointer.load(f"run-{n}")
        assert snap.entries == [AssistantEntry(f"{n}.{t}") for t in range(8)]
        assert snap.head.turns == 7


async def test_saved_data_is_a_copy_of_the_callers_objects(checkpointer: Any) -> None:
    state: dict[str, Any] = {"k": [1]}
    entries = [UserEntry("hi")]
    await checkpointer.append("run", entries, head(context_state=state))
    state["k"].append(2)
    entries.append(UserEntry("added later"))
    snap = await checkpointer.load("run")
    assert snap.head.context_state == {"k": [1]}
    assert snap.entries == [UserEntry("hi")]


def test_a_head_written_before_a_field_existed_or_after_one_was_added_reads() -> None:
    # Older releases wrote no finish_reason; a newer one may write keys this one lacks.
    stored = head(status="completed", output="x").to_dict()
    del stored["finish_reason"]
    stored["written_by_a_newer_release"] = True
    read = RunHead.from_dict(stored)
    assert read == head(status="completed", output="x")
    assert read.finish_reason is None
