"""Transcript entries: round-trips, unknown data, tool-consistency."""

from __future__ import annotations

import json

import pytest

from webapp.transcript import (
    AssistantEntry,
    ReasoningEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
    drop_dangling_tool_calls,
    entry_from_dict,
    entry_to_dict,
)

ALL = [
    UserEntry("hi <b>"),
    AssistantEntry("hello"),
    ReasoningEntry("thinking"),
    ToolCallEntry("c1", "calculator", '{"expression": "1+1"}'),
    ToolResultEntry("c1", "2"),
    ToolResultEntry("c2", "boom", is_error=True),
]


@pytest.mark.parametrize("entry", ALL)
def test_round_trip_through_json(entry):
    data = json.loads(json.dumps(entry_to_dict(entry)))
    assert entry_from_dict(data) == entry


def test_dict_names_its_type():
    assert entry_to_dict(ToolResultEntry("c", "out")) == {
        "type": "tool_result",
        "call_id": "c",
        "output": "out",
        "is_error": False,
    }


def test_unknown_keys_are_ignored_so_stored_data_survives_upgrades():
    assert entry_from_dict({"type": "user", "text": "x", "added_in_v9": 1}) == UserEntry("x")


def test_unknown_type_raises_rather_than_dropping_data():
    with pytest.raises(ValueError, match="unknown transcript entry type 'image'"):
        entry_from_dict({"type": "image", "url": "x"})
    with pytest.raises(ValueError, match="malformed user entry"):
        entry_from_dict({"type": "user"})


def test_entries_are_immutable():
    with pytest.raises(AttributeError):
        UserEntry("x").text = "y"  # type: ignore[misc]


def test_drop_dangling_tool_calls_keeps_answered_calls_and_order():
    entries = [
        UserEntry("q"),
        ToolCallEntry("a", "t", "{}"),
        ToolCallEntry("b", "t", "{}"),
        ToolResultEntry("a", "ok"),
        AssistantEntry("partial"),
    ]
    assert drop_dangling_tool_calls(entries) == [
        UserEntry("q"),
        ToolCallEntry("a", "t", "{}"),
        ToolResultEntry("a", "ok"),
        AssistantEntry("partial"),
    ]


def test_drop_dangling_never_creates_orphan_results():
    entries = [ToolResultEntry("x", "orphan already"), ToolCallEntry("y", "t", "{}")]
    assert drop_dangling_tool_calls(entries) == [ToolResultEntry("x", "orphan already")]
