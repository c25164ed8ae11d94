"""What only the SQLite stores promise: durability, lifecycle, sharing one file, loud corruption."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import pytest

from webapp.stores.checkpoint import RunHead
from webapp.stores.sqlite import StoredDataError
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.stores.sqlite_session import TAIL_SQL, SQLiteSession
from webapp.transcript import AssistantEntry, ToolCallEntry, ToolResultEntry, UserEntry

WAL = pytest.mark.parametrize("wal", [False, True], ids=["rollback", "wal"])


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


# --- lifecycle ------------------------------------------------------------------------


@WAL
async def test_file_is_opened_lazily_and_survives_a_new_instance(tmp_path: Path, wal: bool) -> None:
    db = tmp_path / "chat.db"
    session, cp = SQLiteSession(db, wal=wal), SQLiteCheckpointer(db, wal=wal)
    assert not db.exists()
    await session.append("s", [UserEntry("hi"), AssistantEntry("yo")], run_id="r", meta={"m": 1})
    await cp.append("run", [UserEntry("hi")], RunHead("main", turns=1))
    await session.close()
    await cp.close()

    async with SQLiteSession(db, wal=wal) as again, SQLiteCheckpointer(db, wal=wal) as cp2:
        segments = await again.segments("s")
        assert [(s.run_id, s.meta) for s in segments] == [("r", {"m": 1})]
        snap = await cp2.load("run")
        assert snap is not None and snap.entries == [UserEntry("hi")]
        assert snap.head.turns == 1


async def test_close_is_idempotent_and_a_closed_store_reopens(tmp_path: Path) -> None:
    session = SQLiteSession(tmp_path / "s.db")
    await session.close()  # never opened
    await session.append("s", [UserEntry("1")], run_id="a")
    await session.close()
    await session.close()
    await session.append("s", [UserEntry("2")], run_id="b")
    assert await session.load("s") == [UserEntry("1"), UserEntry("2")]
    await session.close()

    cp = SQLiteCheckpointer(tmp_path / "c.db")
    async with cp:
        await cp.append("run", [UserEntry("x")], RunHead("main"))
    async with cp:
        assert (await cp.load("run")).entries == [UserEntry("x")]  # type: ignore[union-attr]


async def test_close_waits_for_queued_writes(tmp_path: Path) -> None:
    session = SQLiteSession(tmp_path / "s.db", wal=True)
    writes = [
        asyncio.ensure_future(session.append("s", [UserEntry(str(i))], run_id=str(i)))
        for i in range(30)
    ]
    await asyncio.sleep(0)
    await session.close()
    await asyncio.gather(*writes)
    with raw(tmp_path / "s.db") as conn:
        assert conn.execute("SELECT count(*) FROM session_segments").fetchone()[0] == 30


async def test_schema_versions_are_recorded(tmp_path: Path) -> None:
    db = tmp_path / "both.db"
    async with SQLiteSession(db, wal=True) as s, SQLiteCheckpointer(db, wal=True) as c:
        await s.load("x")
        await c.load("x")
    with raw(db) as conn:
        rows = dict(conn.execute("SELECT name, version FROM schema_versions").fetchall())
        assert rows == {"session": 1, "checkpoint": 2}  # 2: the streamed text (issue 35)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_an_unwritable_path_fails_with_a_clear_error(tmp_path: Path) -> None:
    session = SQLiteSession(tmp_path / "missing-dir" / "s.db")
    with pytest.raises(sqlite3.OperationalError, match="missing-dir.*does not exist"):
        await session.load("s")


# --- layout: rewind reads only the tail, checkpoints never rewrite -------------------------


async def test_rewind_reads_the_tail_through_an_index(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with SQLiteSession(db) as session:
        await session.load("s")
    with raw(db) as conn:
        plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + TAIL_SQL, ("s", 5)))
    assert "USING INDEX session_segments_end" in plan
    assert "<expr>>?" in plan


async def test_rewind_leaves_rows_before_the_cut_untouched(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with SQLiteSession(db) as session:
        for i in range(50):
            await session.append("s", [UserEntry(f"q{i}"), AssistantEntry(f"a{i}")], run_id=str(i))
        with raw(db) as conn:
            # Any write to an early row would now fail loudly.
            conn.execute(
                "CREATE TRIGGER guard BEFORE UPDATE ON session_segments WHEN old.seq < 49 "
                "BEGIN SELECT RAISE(ABORT, 'early row rewritten'); END"
            )
        assert await session.rewind("s", keep_entries=99) == 1
        assert len(await session.load("s")) == 99


@WAL
async def test_checkpoint_entries_are_appended_never_rewritten(tmp_path: Path, wal: bool) -> None:
    db = tmp_path / "runs.db"
    async with SQLiteCheckpointer(db, wal=wal) as cp:
        await cp.append("run", [UserEntry("go")], RunHead("main"))
        with raw(db) as conn:
            conn.execute(
                "CREATE TRIGGER no_update BEFORE UPDATE ON checkpoint_entries "
                "BEGIN SELECT RAISE(ABORT, 'saved entry rewritten'); END"
            )
            conn.execute(
                "CREATE TRIGGER no_delete BEFORE DELETE ON checkpoint_entries "
                "BEGIN SELECT RAISE(ABORT, 'saved entry deleted'); END"
            )
        for turn in range(1, 20):
            await cp.append(
                "run",
                [ToolCallEntry(f"c{turn}", "t", "{}"), ToolResultEntry(f"c{turn}", "ok")],
                RunHead("main", turns=turn),
            )
        snap = await cp.load("run")
    assert snap is not None and len(snap.entries) == 39 and snap.head.turns == 19
    with raw(db) as conn:
        idx = [r[0] for r in conn.execute("SELECT idx FROM checkpoint_entries ORDER BY idx")]
        assert idx == list(range(39))
        assert conn.execute("SELECT entry_count FROM checkpoint_heads").fetchone()[0] == 39


# --- sharing one file -------------------------------------------------------------------


async def test_session_and_checkpointer_share_one_wal_file_under_load(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    session, cp = SQLiteSession(db, wal=True), SQLiteCheckpointer(db, wal=True)
    other_session = SQLiteSession(db, wal=True)  # a second connection writing the same table

    async def chat(n: int) -> None:
        for turn in range(10):
            rid = f"run-{n}-{turn}"
            await cp.append(rid, [UserEntry(f"{n}.{turn}")], RunHead("main"))
            await cp.append(rid, [AssistantEntry("ok")], RunHead("main", status="completed"))
            store = session if n % 2 else other_session
            await store.append(f"chat-{n}", [UserEntry(f"{n}.{turn}")], run_id=rid)
            await session.load(f"chat-{n}")

    try:
        await asyncio.gather(*(chat(n) for n in range(12)))
        for n in range(12):
            segments = await session.segments(f"chat-{n}")
            assert [s.run_id for s in segments] == [f"run-{n}-{t}" for t in range(10)]
            snap = await cp.load(f"run-{n}-9")
            assert snap is not None and snap.status == "completed" and len(snap.entries) == 2
    finally:
        for store in (session, cp, other_session):
            await store.close()


# --- corrupt rows raise, naming the row ------------------------------------------------------


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("entries_json", "not json", "entries_json"),
        ("entries_json", '[{"type": "alien", "text": "x"}]', "alien"),
        ("entries_json", '{"type": "user"}', "JSON list"),
        ("meta_json", "{broken", "meta_json"),
    ],
)
async def test_an_undecodable_segment_raises_naming_the_row(
    tmp_path: Path, column: str, value: str, message: str
) -> None:
    db = tmp_path / "s.db"
    async with SQLiteSession(db) as session:
        await session.append("s", [UserEntry("fine")], run_id="good")
        await session.append("s", [UserEntry("soon bad")], run_id="bad")
        with raw(db) as conn:
            conn.execute(f"UPDATE session_segments SET {column} = ? WHERE run_id = 'bad'", (value,))
        with pytest.raises(StoredDataError, match=f"run_id='bad'.*{message}") as info:
            await session.segments("s")
        assert "seq=2" in str(info.value)
        if column == "entries_json":
            with pytest.raises(StoredDataError, match="run_id='bad'"):
                await session.load("s")


async def test_an_undecodable_checkpoint_raises_naming_the_row(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    async with SQLiteCheckpointer(db) as cp:
        await cp.append("run", [UserEntry("a"), UserEntry("b")], RunHead("main"))
        with raw(db) as conn:
            conn.execute("UPDATE checkpoint_entries SET entry_json = '{\"type\": 7}' WHERE idx = 1")
        with pytest.raises(StoredDataError, match="run_id='run', idx=1"):
            await cp.load("run")
        with raw(db) as conn:
            conn.execute("DELETE FROM checkpoint_entries WHERE idx = 0")
        with pytest.raises(StoredDataError, match="entries 0..1"):
            await cp.load("run")
        with raw(db) as conn:
            conn.execute("UPDATE checkpoint_heads SET head_json = '[]'")
        with pytest.raises(StoredDataError, match="checkpoint_heads row for run 'run'"):
            await cp.load("run")


async def test_bad_input_fails_before_touching_the_file(tmp_path: Path) -> None:
    async with SQLiteSession(tmp_path / "s.db") as session:
        with pytest.raises(ValueError, match="meta must be JSON-serializable"):
            await session.append("s", [UserEntry("x")], run_id="r", meta={"f": object()})
        with pytest.raises(TypeError, match="not a transcript entry"):
            await session.append("s", ["not an entry"], run_id="r")  # type: ignore[list-item]
        assert await session.segments("s") == []
    async with SQLiteCheckpointer(tmp_path / "c.db") as cp:
        with pytest.raises(ValueError, match="not JSON-serializable"):
            await cp.append("run", [], RunHead("main", context_state={"f": object()}))
        assert await cp.load("run") is None


async def test_close_during_the_first_open_still_closes(tmp_path: Path) -> None:
    session = SQLiteSession(tmp_path / "s.db")
    first = asyncio.ensure_future(session.load("s"))
    await asyncio.sleep(0)  # the load task queues its job and starts the worker
    await asyncio.sleep(0)  # the worker takes the job and starts opening the file
    await session.close()
    assert await first == []
    assert open_files(tmp_path / "s.db") == []  # not left open behind close()'s back


def open_files(path: Path) -> list[str]:
    """Descriptors of this process pointing at ``path`` (Linux /proc)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)):
            found.append(target)
    return found
