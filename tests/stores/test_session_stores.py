"""The Session contract (SPEC §2), checked on every built-in store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from webapp.stores.session import Segment, Session
from webapp.transcript import (
    AssistantEntry,
    Entry,
    ReasoningEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
)


def turn(n: int) -> list[Entry]:
    return [UserEntry(f"q{n}"), AssistantEntry(f"a{n}")]


def tool_run(n: int, output: str = "result", *, is_error: bool = False) -> list[Entry]:
    return [
        UserEntry(f"q{n}"),
        ToolCallEntry(f"call-{n}", "lookup", f'{{"n": {n}}}'),
        ToolResultEntry(f"call-{n}", output, is_error=is_error),
        AssistantEntry(f"a{n}"),
    ]


async def fill(session: Any, sid: str, runs: list[list[Entry]]) -> list[str]:
    return [
        await session.append(sid, entries, run_id=f"r{i}", meta={"i": i})
        for i, entries in enumerate(runs)
    ]


# --- protocol basics ---------------------------------------------------------------


async def test_is_a_session(session: Any) -> None:
    assert isinstance(session, Session)


async def test_append_then_segments_and_load_in_run_order(session: Any) -> None:
    await session.append("s", turn(1), run_id="a", meta={"summary": "one", "n": [1, 2]})
    await session.append("s", tool_run(2), run_id="b")
    segments = await session.segments("s")
    assert segments == [
        Segment("a", turn(1), {"summary": "one", "n": [1, 2]}),
        Segment("b", tool_run(2), None),
    ]
    assert await session.load("s") == turn(1) + tool_run(2)


async def test_every_entry_kind_round_trips(session: Any) -> None:
    entries: list[Entry] = [
        UserEntry("héllo ✓"),
        ReasoningEntry("thinking"),
        ToolCallEntry("c1", "calc", '{"expression": "1+1"}'),
        ToolResultEntry("c1", "boom", is_error=True),
        AssistantEntry(""),
    ]
    await session.append("s", entries, run_id="r")
    assert await session.load("s") == entries


async def test_tool_results_keep_their_images_and_old_rows_read_without(session: Any) -> None:
    image = "data:image/png;base64,iVBORw0KGgo="
    runs = [
        [ToolResultEntry("c1", "[image: image/png]", images=(image,)), ToolResultEntry("c2", "x")],
        [ToolResultEntry("c3", "plain"), ToolResultEntry("c4", "[image]", images=(image, image))],
    ]
    for i, entries in enumerate(runs):  # a shape seen once is read the fast way after
        await session.append("s", entries, run_id=f"r{i}")
    for _ in range(2):
        loaded = await session.load("s")
        assert loaded == [e for run in runs for e in run]
        assert [e.images for e in loaded] == [(image,), (), (), (image, image)]
        assert all(type(e.images) is tuple for e in loaded)
    # written back as entry_to_dict writes them: no "images" key where there are none
    await session.append("t", [e for run in runs for e in run], run_id="again")
    assert await session.load("t") == [e for run in runs for e in run]


async def test_unknown_session_is_empty(session: Any) -> None:
    assert await session.segments("nobody") == []
    assert await session.load("nobody") == []


async def test_append_generates_distinct_run_ids(session: Any) -> None:
    first = await session.append("s", turn(1))
    second = await session.append("s", turn(2))
    assert first and second and first != second
    assert [s.run_id for s in await session.segments("s")] == [first, second]


async def test_append_is_idempotent_per_run_id(session: Any) -> None:
    assert await session.append("s", turn(1), run_id="r", meta={"v": 1}) == "r"
    assert await session.append("s", turn(9), run_id="r", meta={"v": 2}) == "r"
    assert await session.segments("s") == [Segment("r", turn(1), {"v": 1})]


async def test_run_id_is_scoped_to_its_session(session: Any) -> None:
    await session.append("s1", turn(1), run_id="r")
    await session.append("s2", turn(2), run_id="r")
    assert await session.load("s1") == turn(1)
    assert await session.load("s2") == turn(2)


async def test_empty_run_is_kept_as_a_segment(session: Any) -> None:
    await session.append("s", [], run_id="empty")
    await session.append("s", turn(1), run_id="r")
    assert [s.run_id for s in await session.segments("s")] == ["empty", "r"]
    assert await session.load("s") == turn(1)


async def test_clear_drops_only_that_session(session: Any) -> None:
    await session.append("s", turn(1), run_id="r")
    await session.append("other", turn(2), run_id="r")
    await session.clear("s")
    await session.clear("never-existed")
    assert await session.load("s") == []
    assert await session.load("other") == turn(2)
    # A cleared session's run_ids are free again.
    await session.append("s", turn(3), run_id="r")
    assert await session.load("s") == turn(3)


async def test_returned_lists_and_meta_are_copies(session: Any) -> None:
    entries, meta = turn(1), {"nested": {"k": [1]}}
    await session.append("s", entries, run_id="r", meta=meta)
    entries.append(UserEntry("added after append"))
    meta["nested"]["k"].append(2)
    loaded = await session.load("s")
    loaded.append(UserEntry("caller's own"))
    seg = (await session.segments("s"))[0]
    seg.entries.clear()
    assert seg.meta is not None
    seg.meta["nested"]["k"].append(3)
    assert await session.segments("s") == [Segment("r", turn(1), {"nested": {"k": [1]}})]


async def test_many_concurrent_tasks_share_one_store(session: Any) -> None:
    async def writer(task: int) -> None:
        for i in range(15):
            await session.append(f"s{task % 4}", [UserEntry(f"{task}:{i}")], run_id=f"{task}-{i}")
            if i % 5 == 0:
                await session.load(f"s{task % 4}")

    await asyncio.gather(*(writer(t) for t in range(24)))
    seen: list[str] = []
    for sid in range(4):
        segments = await session.segments(f"s{sid}")
        ids = [s.run_id for s in segments]
        assert len(ids) == len(set(ids))
        seen += ids
        # Each task appended sequentially, so its own runs stay in its order.
        for task in range(sid, 24, 4):
            mine = [int(r.split("-")[1]) for r in ids if r.split("-")[0] == str(task)]
            assert mine == list(range(15))
        assert [e for s in segments for e in s.entries] == await session.load(f"s{sid}")
    assert sorted(seen) == sorted(f"{t}-{i}" for t in range(24) for i in range(15))


async def test_concurrent_appends_of_one_run_id_store_it_once(session: Any) -> None:
    await asyncio.gather(*(session.append("s", turn(i), run_id="same") for i in range(20)))
    segments = await session.segments("s")
    assert len(segments) == 1 and segments[0].run_id == "same"


# --- rewind -------------------------------------------------------------------------


async def test_rewind_inside_a_run_truncates_it_clears_meta_and_deletes_later_runs(
    session: Any,
) -> None:
    await fill(session, "s", [turn(0), tool_run(1), turn(2)])  # 2 + 4 + 2 entries
    removed = await session.rewind("s", keep_entries=3)
    assert removed == 5
    assert await session.segments("s") == [
        Segment("r0", turn(0), {"i": 0}),
        Segment("r1", [UserEntry("q1")], None),
    ]


async def test_rewind_between_a_tool_call_and_its_result_drops_the_call(session: Any) -> None:
    await fill(session, "s", [turn(0), tool_run(1)])
    removed = await session.rewind("s", keep_entries=4)  # keeps q0 a0 q1 call-1
    assert removed == 3
    assert await session.load("s") == turn(0) + [UserEntry("q1")]
    loaded = await session.load("s")
    assert not any(isinstance(e, ToolCallEntry) for e in loaded)


async def test_rewind_at_a_run_boundary_keeps_earlier_runs_untouched(session: Any) -> None:
    await fill(session, "s", [turn(0), tool_run(1), turn(2)])
    assert await session.rewind("s", keep_entries=6) == 2
    assert await session.segments("s") == [
        Segment("r0", turn(0), {"i": 0}),
        Segment("r1", tool_run(1), {"i": 1}),
    ]


async def test_rewind_to_zero_empties_the_session(session: Any) -> None:
    await session.append("s", [], run_id="empty-first")
    await fill(session, "s", [turn(0), turn(1)])
    assert await session.rewind("s", keep_entries=0) == 4
    assert await session.segments("s") == []


@pytest.mark.parametrize("keep", [6, 7, 1000])
async def test_rewind_at_or_past_the_end_changes_nothing(session: Any, keep: int) -> None:
    await fill(session, "s", [turn(0), tool_run(1)])
    before = await session.segments("s")
    assert await session.rewind("s", keep_entries=keep) == 0
    assert await session.segments("s") == before  # meta kept too


async def test_rewind_of_an_unknown_session_is_a_no_op(session: Any) -> None:
    assert await session.rewind("nobody", keep_entries=0) == 0
    assert await session.rewind("nobody", keep_entries=5) == 0


@pytest.mark.parametrize("keep", [-1, 1.5, "2", True])
async def test_rewind_rejects_a_bad_keep_entries(session: Any, keep: object) -> None:
    await fill(session, "s", [turn(0)])
    with pytest.raises(ValueError, match="keep_entries"):
        await session.rewind("s", keep_entries=keep)
    assert await session.load("s") == turn(0)


async def test_a_run_truncated_to_nothing_is_deleted_and_its_id_is_free(session: Any) -> None:
    run: list[Entry] = [
        ToolCallEntry("c", "lookup", "{}"),
        ToolResultEntry("c", "out"),
        AssistantEntry("done"),
    ]
    await session.append("s", turn(0), run_id="keep")
    await session.append("s", run, run_id="gone", meta={"m": 1})
    removed = await session.rewind("s", keep_entries=3)  # only the call would stay: dropped
    assert removed == 3
    assert [s.run_id for s in await session.segments("s")] == ["keep"]
    await session.append("s", turn(5), run_id="gone")
    assert await session.load("s") == turn(0) + turn(5)


async def test_a_deleted_run_id_can_be_appended_again(session: Any) -> None:
    await fill(session, "s", [turn(0), turn(1)])
    await session.rewind("s", keep_entries=2)
    await session.append("s", turn(7), run_id="r1", meta={"again": True})
    assert await session.segments("s") == [
        Segment("r0", turn(0), {"i": 0}),
        Segment("r1", turn(7), {"again": True}),
    ]


async def test_a_truncated_run_keeps_its_id_so_re_appending_is_a_no_op(session: Any) -> None:
    await fill(session, "s", [turn(0), turn(1)])
    await session.rewind("s", keep_entries=3)
    await session.append("s", turn(9), run_id="r1")
    assert await session.segments("s") == [
        Segment("r0", turn(0), {"i": 0}),
        Segment("r1", [UserEntry("q1")], None),
    ]


async def test_positions_stay_right_after_rewind_and_new_appends(session: Any) -> None:
    # A store that records positions must keep them right for the next rewind.
    await fill(session, "s", [turn(0), tool_run(1), turn(2)])
    await session.rewind("s", keep_entries=5)  # q0 a0 q1 call result -> r1 keeps 3
    await session.append("s", turn(3), run_id="r3")
    await session.append("s", [], run_id="r4")
    await session.append("s", turn(5), run_id="r5")
    flat = await session.load("s")
    assert len(flat) == 2 + 3 + 2 + 2
    assert await session.rewind("s", keep_entries=6) == 3
    assert await session.load("s") == flat[:6]
    assert [s.run_id for s in await session.segments("s")] == ["r0", "r1", "r3"]
    assert (await session.segments("s"))[2].meta is None  # r3 was cut into


# --- trim_tool_results -------------------------------------------------------------------

LONG = "x" * 1000


async def test_trim_shortens_only_runs_before_the_last_keep_runs(session: Any) -> None:
    await fill(session, "s", [tool_run(0, LONG), tool_run(1, LONG), tool_run(2, LONG)])
    assert await session.trim_tool_results("s", keep_chars=10, keep_runs=1) == 2
    segments = await session.segments("s")
    outputs = [s.entries[2].output for s in segments]  # type: ignore[union-attr]
    assert outputs[2] == LONG
    for i, out in enumerate(outputs[:2]):
        assert out.startswith("x" * 10) and not out.startswith("x" * 11)
        assert "990" in out and "1000" in out and f'recall_tool_result("call-{i}")' in out
        assert len(out) < len(LONG)
    assert [s.meta for s in segments] == [{"i": 0}, {"i": 1}, {"i": 2}]


async def test_trim_keeps_structure_and_error_flags(session: Any) -> None:
    runs = [tool_run(0, LONG, is_error=True), tool_run(1, LONG)]
    await fill(session, "s", runs)
    await session.trim_tool_results("s", keep_chars=5, keep_runs=0)
    loaded = await session.load("s")
    original = runs[0] + runs[1]
    assert len(loaded) == len(original)
    for got, want in zip(loaded, original, strict=True):
        assert type(got) is type(want)
        if isinstance(want, ToolResultEntry):
            assert isinstance(got, ToolResultEntry)
            assert (got.call_id, got.is_error) == (want.call_id, want.is_error)
        else:
            assert got == want


async def test_trim_is_idempotent(session: Any) -> None:
    await fill(session, "s", [tool_run(0, LONG), tool_run(1, LONG)])
    assert await session.trim_tool_results("s", keep_chars=20) == 1
    once = await session.load("s")
    assert await session.trim_tool_results("s", keep_chars=20) == 0
    assert await session.load("s") == once


async def test_trim_leaves_short_outputs_alone(session: Any) -> None:
    near = "y" * 60  # longer than keep_chars, but the marker would make it longer
    await fill(session, "s", [tool_run(0, "short"), tool_run(1, near), tool_run(2, LONG)])
    assert await session.trim_tool_results("s", keep_chars=50, keep_runs=0) == 1
    loaded = await session.load("s")
    assert loaded[2] == ToolResultEntry("call-0", "short")
    assert loaded[6] == ToolResultEntry("call-1", near)
    assert len(loaded[10].output) < len(LONG)  # type: ignore[union-attr]


async def test_trim_with_more_keep_runs_than_runs_trims_nothing(session: Any) -> None:
    await fill(session, "s", [tool_run(0, LONG)])
    assert await session.trim_tool_results("s", keep_chars=0, keep_runs=5) == 0
    assert await session.trim_tool_results("nobody") == 0
    assert await session.load("s") == tool_run(0, LONG)


async def test_trim_default_keeps_400_chars_of_older_runs(session: Any) -> None:
    await fill(session, "s", [tool_run(0, LONG), tool_run(1, LONG)])
    assert await session.trim_tool_results("s") == 1
    out = (await session.load("s"))[2].output  # type: ignore[union-attr]
    assert out.startswith("x" * 400) and not out.startswith("x" * 401)


@pytest.mark.parametrize("kwargs", [{"keep_chars": -1}, {"keep_runs": -1}])
async def test_trim_rejects_negative_arguments(session: Any, kwargs: dict[str, int]) -> None:
    await fill(session, "s", [tool_run(0, LONG), tool_run(1, LONG)])
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        await session.trim_tool_results("s", **kwargs)
    assert await session.load("s") == tool_run(0, LONG) + tool_run(1, LONG)
