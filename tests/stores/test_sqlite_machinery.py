"""SQLiteStore: serialized jobs, group commit, failure isolation, lock waits, schema versions.

A job is a coroutine function of the aiosqlite connection; these tests hand the
store such functions (and one-statement jobs) and check what the file holds.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from webapp.stores.sqlite import SQLiteStore
from webapp.stores.sqlite_connection import StoreBusyError

SCHEMA = "CREATE TABLE items (name TEXT PRIMARY KEY, note TEXT);"


def make_store(path: Path, **kwargs: object) -> SQLiteStore:
    options: dict[str, object] = {
        "schema_name": "items",
        "schema_version": 1,
        "schema_sql": SCHEMA,
    }
    options.update(kwargs)
    return SQLiteStore(path, **options)  # type: ignore[arg-type]


INSERT = "INSERT INTO items (name) VALUES (?)"
Fn = Callable[[aiosqlite.Connection], Awaitable[Any]]


def raw(path: Path | str) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def insert(name: str) -> Callable[[aiosqlite.Connection], Awaitable[str]]:
    async def fn(db: aiosqlite.Connection) -> str:
        await db.execute(INSERT, (name,))
        return name

    return fn


async def names(store: SQLiteStore) -> list[str]:
    async def fn(db: aiosqlite.Connection) -> list[str]:
        return [r[0] for r in await db.execute_fetchall("SELECT name FROM items ORDER BY name")]

    return await store.read(fn)


async def hold_writer(store: SQLiteStore) -> tuple[asyncio.Event, asyncio.Task[str]]:
    """Start a write that keeps its transaction open until the event is set; the
    store's other jobs queue up behind it meanwhile."""
    release, started = asyncio.Event(), asyncio.Event()

    async def blocker(db: aiosqlite.Connection) -> str:
        await db.execute("INSERT INTO items (name) VALUES ('blocker')")
        started.set()
        await asyncio.wait_for(release.wait(), 10)  # bounded: a failing test must not hang
        return "blocker"

    task = asyncio.ensure_future(store.write(blocker))
    await asyncio.wait_for(started.wait(), 5)
    return release, task


async def reader_holding_a_lock(store: SQLiteStore) -> sqlite3.Connection:
    """A reader in an open transaction on ``store``'s file (created first). With a
    rollback journal, a COMMIT waits for it to go: call its COMMIT and close it."""
    await names(store)
    reader = raw(store.path)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM items").fetchone()
    return reader


async def as_statement(store: SQLiteStore, name: str) -> None:
    await store.execute(INSERT, (name,))


async def as_function(store: SQLiteStore, name: str) -> None:
    await store.write(insert(name))


WAL = pytest.mark.parametrize("wal", [False, True], ids=["rollback", "wal"])
KINDS = pytest.mark.parametrize("write", [as_statement, as_function], ids=["sql", "fn"])
JobKind = Callable[[SQLiteStore, str], Awaitable[None]]


@pytest.fixture(params=[False, True], ids=["rollback", "wal"])
async def store(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    s = make_store(tmp_path / "items.db", wal=request.param)
    yield s
    await s.close()


async def test_a_failing_write_does_not_take_its_batch_down(
    store: SQLiteStore, tmp_path: Path
) -> None:
    release, blocker = await hold_writer(store)
    committed_seen: dict[str, int] = {}
    observer = sqlite3.connect(tmp_path / "items.db", timeout=5, check_same_thread=False)

    def observed(name: str, fail: BaseException | None = None) -> Fn:
        async def fn(db: aiosqlite.Connection) -> str:
            await db.execute(INSERT, (name,))
            if store.wal:  # rows other connections can see = committed rows
                committed_seen[name] = observer.execute("SELECT count(*) FROM items").fetchone()[0]
            if fail is not None:
                raise fail
            return name

        return fn

    jobs = [observed(f"good{i}") for i in range(5)]
    jobs.append(observed("half-done", RuntimeError("tool exploded")))
    jobs += [observed(f"good{i}") for i in range(5, 9)]
    jobs.append(insert("good0"))  # violates the primary key
    tasks = [asyncio.ensure_future(store.write(fn)) for fn in jobs]
    await asyncio.sleep(0.05)
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    observer.close()

    assert await blocker == "blocker"
    assert results[:5] + results[6:10] == [f"good{i}" for i in range(9)]
    assert isinstance(results[5], RuntimeError) and "tool exploded" in str(results[5])
    assert isinstance(results[10], sqlite3.IntegrityError)
    assert await names(store) == ["blocker"] + [f"good{i}" for i in range(9)]
    if store.wal:
        # Every write ran while only the blocker was committed: one shared transaction.
        assert set(committed_seen.values()) == {1}


async def test_a_lone_failing_write_reports_its_error_and_the_store_goes_on(
    store: SQLiteStore,
) -> None:
    async def broken(db: aiosqlite.Connection) -> None:
        await db.execute("INSERT INTO items (name) VALUES ('partial')")
        await db.execute("INSERT INTO no_such_table VALUES (1)")

    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        await store.write(broken)
    assert await store.write(insert("after")) == "after"
    assert await names(store) == ["after"]


async def test_a_read_waits_for_the_open_write_and_never_sees_it_half_done(
    store: SQLiteStore,
) -> None:
    release, blocker = await hold_writer(store)
    reader = asyncio.ensure_future(names(store))
    await asyncio.sleep(0.1)
    assert not reader.done()  # it would have seen the uncommitted 'blocker' row
    release.set()
    await blocker
    assert await asyncio.wait_for(reader, 5) == ["blocker"]


async def test_a_write_cancelled_while_queued_is_skipped(store: SQLiteStore) -> None:
    release, blocker = await hold_writer(store)
    doomed = asyncio.ensure_future(store.write(insert("doomed")))
    kept = asyncio.ensure_future(store.write(insert("kept")))
    await asyncio.sleep(0.01)
    doomed.cancel()
    release.set()
    await blocker
    assert await kept == "kept"
    assert await names(store) == ["blocker", "kept"]


async def test_a_write_whose_caller_is_cancelled_mid_transaction_still_commits(
    store: SQLiteStore,
) -> None:
    release, blocker = await hold_writer(store)
    blocker.cancel()
    await asyncio.sleep(0.01)
    release.set()
    assert await names(store) == ["blocker"]


@KINDS
@WAL
async def test_a_write_waits_for_another_connections_lock(
    tmp_path: Path, wal: bool, write: JobKind
) -> None:
    path = tmp_path / "items.db"
    store = make_store(path, wal=wal)
    await names(store)  # create the schema
    other = raw(path)
    other.execute("BEGIN IMMEDIATE")
    asyncio.get_running_loop().call_later(0.4, other.execute, "COMMIT")
    started = time.monotonic()
    await write(store, "late")
    assert time.monotonic() - started >= 0.3
    assert await names(store) == ["late"]  # once, not retried into a duplicate
    other.close()
    await store.close()


async def test_opening_waits_for_another_connections_lock_to_apply_its_schema(
    tmp_path: Path,
) -> None:
    path = tmp_path / "items.db"
    other = raw(path)
    other.execute("BEGIN IMMEDIATE")
    asyncio.get_running_loop().call_later(0.4, other.execute, "COMMIT")
    store = make_store(path, wal=False, busy_timeout=5)
    started = time.monotonic()
    assert await names(store) == []
    assert time.monotonic() - started >= 0.3
    # The tables and their version, together and once.
    assert other.execute("SELECT name, version FROM schema_versions").fetchall() == [("items", 1)]
    await store.write(insert("a"))
    assert await names(store) == ["a"]
    other.close()
    await store.close()


async def test_a_lock_held_too_long_gives_up_clearly_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "items.db"
    store = make_store(path, wal=True, busy_timeout=0.3)
    await names(store)
    other = raw(path)
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreBusyError, match="locked by another connection.*nothing was written"):
        await store.write(insert("blocked"))
    other.execute("COMMIT")
    other.close()
    await store.write(insert("later"))
    assert await names(store) == ["later"]
    await store.close()


@KINDS
async def test_a_commit_blocked_by_a_reader_is_rolled_back_not_half_reported(
    tmp_path: Path, write: JobKind
) -> None:
    # Rollback journal: COMMIT needs readers gone. A busy COMMIT never
    # committed, so the store rolls back and reports that nothing was written.
    store = make_store(tmp_path / "items.db", wal=False, busy_timeout=0.3)
    reader = await reader_holding_a_lock(store)
    with pytest.raises(StoreBusyError, match="nothing was written"):
        await write(store, "blocked")
    reader.execute("COMMIT")
    reader.close()
    assert await names(store) == []
    await write(store, "later")
    assert await names(store) == ["later"]
    await store.close()


async def test_synchronous_full_and_a_busy_timeout_are_set(store: SQLiteStore) -> None:
    async def pragmas(db: aiosqlite.Connection) -> tuple[int, int, str]:
        [(sync,)] = await db.execute_fetchall("PRAGMA synchronous")
        [(busy,)] = await db.execute_fetchall("PRAGMA busy_timeout")
        [(mode,)] = await db.execute_fetchall("PRAGMA journal_mode")
        return sync, busy, mode

    sync, busy, mode = await store.read(pragmas)
    assert sync == 2  # FULL
    assert busy >= 5000
    assert mode == ("wal" if store.wal else "delete")


async def test_schema_versions_allow_migrations_and_refuse_newer_files(tmp_path: Path) -> None:
    path = tmp_path / "items.db"
    async with make_store(path) as v1:
        await v1.write(insert("a"))
    v2 = make_store(
        path,
        schema_version=2,
        schema_sql=SCHEMA.replace(");", ", extra TEXT);"),
        migrations={1: "ALTER TABLE items ADD COLUMN extra TEXT DEFAULT 'x';"},
    )
    async with v2:

        async def extra(db: aiosqlite.Connection) -> list[tuple[str, str]]:
            return [tuple(r) for r in await db.execute_fetchall("SELECT name, extra FROM items")]

        assert await v2.read(extra) == [("a", "x")]
    with pytest.raises(sqlite3.OperationalError, match="schema version 2, newer than.*1"):
        await make_store(path).read(extra)
    with pytest.raises(sqlite3.OperationalError, match="no migration .* from schema version 2"):
        await make_store(path, schema_version=3).read(extra)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_versions").fetchall() == [(2,)]


def test_a_store_keeps_working_in_a_new_event_loop(tmp_path: Path) -> None:
    store = make_store(tmp_path / "items.db", wal=True)
    asyncio.run(store.write(insert("first loop")))

    async def second() -> list[str]:
        await store.write(insert("second loop"))
        try:
            return await names(store)
        finally:
            await store.close()

    assert asyncio.run(second()) == ["first loop", "second loop"]


async def test_one_bad_statement_in_a_shared_executemany_fails_alone(store: SQLiteStore) -> None:
    release, blocker = await hold_writer(store)
    sql = "INSERT INTO items (name, note) VALUES (?, ?)"
    names_in = [f"n{i}" for i in range(6)] + ["n2"] + [f"n{i}" for i in range(6, 9)]
    tasks = [asyncio.ensure_future(store.execute(sql, (n, "note"))) for n in names_in]
    await asyncio.sleep(0.05)
    release.set()
    await blocker
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[6], sqlite3.IntegrityError)
    assert results[:6] + results[7:] == [None] * 9
    assert await names(store) == ["blocker"] + [f"n{i}" for i in range(9)]
    assert await store.fetchall("SELECT count(*) FROM items WHERE note = ?", ("note",)) == [(9,)]


async def test_reads_queued_between_writes_do_not_split_the_batch(tmp_path: Path) -> None:
    path = tmp_path / "items.db"
    store = make_store(path, wal=True)
    release, blocker = await hold_writer(store)
    observer = sqlite3.connect(path, timeout=5, check_same_thread=False)
    seen: list[int] = []

    def write(name: str) -> Fn:
        async def fn(db: aiosqlite.Connection) -> None:
            await db.execute(INSERT, (name,))
            seen.append(observer.execute("SELECT count(*) FROM items").fetchone()[0])

        return fn

    jobs = []
    for i in range(5):
        jobs.append(asyncio.ensure_future(store.write(write(f"w{i}"))))
        jobs.append(asyncio.ensure_future(names(store)))
    await asyncio.sleep(0.05)
    release.set()
    results = await asyncio.gather(blocker, *jobs)
    observer.close()
    await store.close()
    assert seen == [1] * 5  # all five writes ran before any of them committed
    everything = ["blocker"] + [f"w{i}" for i in range(5)]
    assert all(r == everything for r in results[2::2])  # reads served after the commit


# --- transactions awaited statement by statement ------------------------------------------


@KINDS
async def test_a_lone_failing_write_gets_its_error_and_the_store_goes_on(
    tmp_path: Path, write: JobKind
) -> None:
    async with make_store(tmp_path / "items.db") as store:
        await write(store, "a")
        with pytest.raises(sqlite3.IntegrityError):
            await write(store, "a")
        await write(store, "b")
        assert await names(store) == ["a", "b"]


async def test_a_failing_write_of_several_statements_fails_alone_in_its_batch(
    store: SQLiteStore,
) -> None:
    await store.execute(INSERT, ("taken",))

    def twice(name: str) -> Fn:
        async def fn(db: aiosqlite.Connection) -> str:
            await db.execute(INSERT, (name,))
            await db.execute("UPDATE items SET note = 'x' WHERE name = ?", (name,))
            return name

        return fn

    release, blocker = await hold_writer(store)  # the four queue up into one batch
    writes = [asyncio.ensure_future(store.write(twice(n))) for n in ("a", "taken", "b", "c")]
    await asyncio.sleep(0.05)
    release.set()
    results = await asyncio.gather(*writes, return_exceptions=True)
    await blocker
    assert results[0] == "a" and results[2:] == ["b", "c"]
    assert isinstance(results[1], sqlite3.IntegrityError)
    assert await names(store) == ["a", "b", "blocker", "c", "taken"]
    rows = await store.fetchall("SELECT name FROM items WHERE note = 'x' ORDER BY name")
    assert [r[0] for r in rows] == ["a", "b", "c"]  # each write whole, none half done


async def test_a_read_sees_one_state_while_another_connection_commits(tmp_path: Path) -> None:
    path = tmp_path / "items.db"
    async with make_store(path, wal=True) as store:
        await store.execute(INSERT, ("before",))

        async def read(db: aiosqlite.Connection) -> tuple[list[str], list[str]]:
            query = "SELECT name FROM items ORDER BY name"
            first = [r[0] for r in await db.execute_fetchall(query)]
            with closing(raw(path)) as other:  # commits between the read's two statements
                other.execute(INSERT, ("meanwhile",))
            second = [r[0] for r in await db.execute_fetchall(query)]
            return first, second

        assert await store.read(read) == (["before"], ["before"])
        assert await names(store) == ["before", "meanwhile"]  # the read ended: seen now


def wal_frames(path: Path) -> int:
    """Pages written to the WAL so far (it is not truncated while the store is open)."""
    size = os.path.getsize(f"{path}-wal")
    with closing(raw(path)) as conn:
        [(page,)] = conn.execute("PRAGMA page_size").fetchall()
    return max(0, (size - 32) // (page + 24))


@pytest.mark.parametrize("kind", ["sql", "fn"])
async def test_writes_that_come_together_commit_together(tmp_path: Path, kind: str) -> None:
    # Group commit, seen in the file: one commit writes the pages it changed to the
    # WAL once, so thirty appends committed apart would add at least thirty frames.
    path = tmp_path / "items.db"
    async with make_store(path, wal=True) as store:
        await store.execute(INSERT, ("first",))
        before = wal_frames(path)
        write = as_statement if kind == "sql" else as_function
        await asyncio.gather(*(write(store, f"n{i:02d}") for i in range(30)))
        assert wal_frames(path) - before <= 3
        assert len(await names(store)) == 31
        for i in range(3):  # one after another, each commits on its own
            await write(store, f"alone{i}")
        assert wal_frames(path) - before >= 4


@WAL
async def test_a_caller_cancelled_mid_write_leaves_it_whole_and_the_store_usable(
    tmp_path: Path, wal: bool
) -> None:
    path = tmp_path / "items.db"
    async with make_store(path, wal=wal) as store:
        await names(store)
        other = raw(path)
        other.execute("BEGIN IMMEDIATE")  # the write's BEGIN waits inside SQLite for this
        doomed = asyncio.ensure_future(store.execute(INSERT, ("doomed",)))
        await asyncio.sleep(0.1)
        queued = asyncio.ensure_future(store.execute(INSERT, ("queued",)))  # waits its turn
        await asyncio.sleep(0.05)
        doomed.cancel()
        await asyncio.sleep(0.05)
        other.execute("COMMIT")
        other.close()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        await asyncio.wait_for(queued, 5)
        # The cancelled write's batch had begun: it ran to its COMMIT all the same.
        assert await names(store) == ["doomed", "queued"]
        await store.execute(INSERT, ("after",))
        assert await names(store) == ["after", "doomed", "queued"]


def test_a_transaction_cut_short_by_the_loops_end_is_rolled_back(tmp_path: Path) -> None:
    # asyncio.run cancels the worker mid-transaction: it must roll back, or the
    # connection would stay inside a transaction with a half-done write in it.
    store = make_store(tmp_path / "items.db", wal=True)

    async def never_ends(db: aiosqlite.Connection) -> None:
        await db.execute(INSERT, ("half-done",))
        await asyncio.Event().wait()

    async def first() -> None:
        asyncio.ensure_future(store.write(never_ends))
        await asyncio.sleep(0.1)  # the write is inside its transaction: leave it there

    async def second() -> list[str]:
        try:
            await store.write(insert("next loop"))
            return await names(store)
        finally:
            await store.close()

    asyncio.run(first())
    assert asyncio.run(second()) == ["next loop"]
    with closing(raw(tmp_path / "items.db")) as conn:
        assert conn.execute("SELECT name FROM items").fetchall() == [("next loop",)]


async def test_a_job_that_calls_its_own_store_is_refused_and_writes_nothing(
    store: SQLiteStore,
) -> None:
    async def nested(db: aiosqlite.Connection) -> None:
        await db.execute(INSERT, ("outer",))
        await store.execute(INSERT, ("inner",))  # would wait behind this very job

    with pytest.raises(RuntimeError, match="called the same store: it would wait for itself"):
        await asyncio.wait_for(store.write(nested), 5)
    assert await names(store) == []
    await store.write(insert("after"))
    assert await names(store) == ["after"]


async def test_the_event_loop_goes_on_while_a_write_waits_for_a_lock(tmp_path: Path) -> None:
    # SQLite's busy wait happens on the connection's own thread, not the loop's.
    path = tmp_path / "items.db"
    async with make_store(path, wal=True) as store:
        await names(store)
        other = raw(path)
        other.execute("BEGIN IMMEDIATE")
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        asyncio.get_running_loop().call_later(0.3, other.execute, "COMMIT")
        try:
            await store.write(insert("late"))
        finally:
            ticker.cancel()
            other.close()
        assert ticks >= 10
        assert await names(store) == ["late"]
