"""The streamed text of a turn in flight (webapp.stores.streamed), on every built-in store."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from webapp.stores.checkpoint import RunHead
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.stores.streamed import StreamedCheckpointer, StreamedPiece, StreamedTurn
from webapp.transcript import UserEntry


async def test_is_a_streamed_checkpointer(checkpointer: Any) -> None:
    assert isinstance(checkpointer, StreamedCheckpointer)


async def test_pieces_of_a_turn_join_in_order(checkpointer: Any) -> None:
    await checkpointer.save_streamed("run", StreamedPiece(2, 0, "1 2", "think"))
    await checkpointer.save_streamed("run", StreamedPiece(2, 1, " 3 4", "ing"))
    await checkpointer.save_streamed("run", StreamedPiece(2, 2, " 5"))
    assert await checkpointer.load_streamed("run", 2) == StreamedTurn(
        "1 2 3 4 5", "thinking", False, 3
    )
    assert await checkpointer.load_streamed("run", 1) is None  # only the turn asked for
    assert await checkpointer.load_streamed("other", 2) is None


async def test_a_turns_first_piece_drops_every_earlier_piece_of_the_run(checkpointer: Any) -> None:
    await checkpointer.save_streamed("run", StreamedPiece(0, 0, "old"))
    await checkpointer.save_streamed("run", StreamedPiece(0, 1, " text"))
    await checkpointer.save_streamed("other", StreamedPiece(0, 0, "kept"))
    # the same turn redone from nothing: the attempt it replaces is gone
    await checkpointer.save_streamed("run", StreamedPiece(0, 0, "new"))
    assert await checkpointer.load_streamed("run", 0) == StreamedTurn("new", "", False, 1)
    await checkpointer.save_streamed("run", StreamedPiece(1, 0, "next turn"))
    assert await checkpointer.load_streamed("run", 0) is None
    assert (await checkpointer.load_streamed("other", 0)).text == "kept"


async def test_a_piece_saved_twice_is_stored_once(checkpointer: Any) -> None:
    await checkpointer.save_streamed("run", StreamedPiece(0, 0, "a"))
    await checkpointer.save_streamed("run", StreamedPiece(0, 1, "b"))
    await checkpointer.save_streamed("run", StreamedPiece(0, 1, "b"))  # a retry
    assert (await checkpointer.load_streamed("run", 0)).text == "ab"


async def test_a_turn_making_tool_calls_is_marked(checkpointer: Any) -> None:
    await checkpointer.save_streamed("run", StreamedPiece(0, 0, "Let me look"))
    await checkpointer.save_streamed("run", StreamedPiece(0, 1, calls=True))
    assert await checkpointer.load_streamed("run", 0) == StreamedTurn("Let me look", "", True, 2)


async def test_deleting_the_run_deletes_its_pieces(checkpointer: Any) -> None:
    await checkpointer.append("run", [UserEntry("hi")], RunHead(agent_name="a"))
    await checkpointer.save_streamed("run", StreamedPiece(0, 0, "partial"))
    await checkpointer.delete("run")
    assert await checkpointer.load_streamed("run", 0) is None


async def test_bad_positions_are_refused() -> None:
    with pytest.raises(ValueError, match="turn and index must be >= 0"):
        StreamedPiece(0, -1, "x")


async def test_each_save_stores_only_what_it_adds(tmp_path: Path) -> None:
    """A long reply's saves write its text once in all, never the text so far again."""
    db = tmp_path / "runs.db"
    words = [f" w{i}" for i in range(2_000)]
    async with SQLiteCheckpointer(db) as store:
        for index, word in enumerate(words):
            await store.save_streamed("run", StreamedPiece(0, index, word))
        assert (await store.load_streamed("run", 0)).text == "".join(words)
    with sqlite3.connect(db) as conn:
        (stored,) = conn.execute("SELECT sum(length(text)) FROM checkpoint_partials").fetchone()
    assert stored == len("".join(words))


async def test_a_version_1_checkpoint_file_gains_the_table(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:  # what the checkpointer created before it had pieces
        conn.executescript(
            "CREATE TABLE schema_versions (name TEXT PRIMARY KEY, version INTEGER NOT NULL);"
            "INSERT INTO schema_versions VALUES ('checkpoint', 1);"
            "CREATE TABLE checkpoint_heads (run_id TEXT PRIMARY KEY, head_json TEXT NOT NULL,"
            " entry_count INTEGER NOT NULL);"
            "CREATE TABLE checkpoint_entries (run_id TEXT NOT NULL, idx INTEGER NOT NULL,"
            " entry_json TEXT NOT NULL, PRIMARY KEY (run_id, idx));"
        )
    async with SQLiteCheckpointer(db) as store:
        await store.save_streamed("run", StreamedPiece(0, 0, "kept"))
        assert (await store.load_streamed("run", 0)).text == "kept"
    with sqlite3.connect(db) as conn:
        assert conn.execute(
            "SELECT version FROM schema_versions WHERE name = 'checkpoint'"
        ).fetchone() == (2,)
