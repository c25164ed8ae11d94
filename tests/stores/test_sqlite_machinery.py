"""SQLiteStore: serialized jobs, group commit, failure isolation, lock waits, schema versions."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

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


def insert(name: str) -> Callable[[sqlite3.Connection], str]:
    def fn(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO items (name) VALUES (?)", (name,))
        return name

    return fn


async def names(store: SQLiteStore) -> list[str]:
    def fn(conn: sqlite3.Connection) -> list[str]:
        return [r[0] for r in conn.execute("SELECT name FROM items ORDER BY name")]

    return await store.read(fn)


async def hold_writer(store: SQLiteStore) -> tuple[threading.Event, asyncio.Task[str]]:
    """Start a write that keeps its transaction (and the connection's thread) until
    the event is set; the event loop goes on meanwhile, so other jobs queue up."""
    release, started = threading.Event(), threading.Event()

    def blocker(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO items (name) VALUES ('blocker')")
        started.set()
        release.wait(10)  # bounded: a failing test must not hang the thread for ever
        return "blocker"

    task = asyncio.ensure_future(store.write(blocker))
    deadline = time.monotonic() + 5
    while not started.is_set():
        assert time.monotonic() < deadline, "the blocking write never started"
        await asyncio.sleep(0.002)
    return release, task


async def reader_holding_a_lock(store: SQLiteStore) -> sqlite3.Connection:
    """A reader in an open transaction on ``store``'s file (created first). With a
    rollback journal, a COMMIT waits for it to go: call its COMMIT and close it."""
    await names(store)
    reader = sqlite3.connect(store.path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM items").fetchone()
    return reader


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

    def observed(name: str, fail: BaseException | None = None):  # type: ignore[no-untyped-def]
        def fn(conn: sqlite3.Connection) -> str:
            conn.execute("INSERT INTO items (name) VALUES (?)", (name,))
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
    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO items (name) VALUES ('partial')")
        conn.execute("INSERT INTO no_such_table VALUES (1)")

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


@pytest.mark.parametrize("wal", [False, True], ids=["rollback", "wal"])
async def test_a_write_waits_for_another_connections_lock(tmp_path: Path, wal: bool) -> None:
    path = tmp_path / "items.db"
    store = make_store(path, wal=wal)
    await names(store)  # create the schema
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    asyncio.get_running_loop().call_later(0.4, other.execute, "COMMIT")
    started = time.monotonic()
    assert await store.write(insert("late")) == "late"
    assert time.monotonic() - started >= 0.3
    assert await names(store) == ["late"]  # once, not retried into a duplicate
    other.close()
    await store.close()


async def test_opening_waits_for_another_connections_lock_to_apply_its_schema(
    tmp_path: Path,
) -> None:
    path = tmp_path / "items.db"
    other = sqlite3.connect(path, isolation_level=None)
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
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreBusyError, match="locked by another connection.*nothing was written"):
        await store.write(insert("blocked"))
    other.execute("COMMIT")
    other.close()
    await store.write(insert("later"))
    assert await names(store) == ["later"]
    await store.close()


async def test_a_commit_blocked_by_a_reader_is_rolled_back_not_half_reported(
    tmp_path: Path,
) -> None:
    # Rollback journal: COMMIT needs readers gone. A busy COMMIT never
    # committed, so the store rolls back and reports that nothing was written.
    store = make_store(tmp_path / "items.db", wal=False, busy_timeout=0.3)
    reader = await reader_holding_a_lock(store)
    with pytest.raises(StoreBusyError, match="nothing was written"):
        await store.write(insert("blocked"))
    reader.execute("COMMIT")
    reader.close()
    assert await names(store) == []
    await store.write(insert("later"))
    assert await names(store) == ["later"]
    await store.close()


async def test_a_write_is_told_its_result_while_its_commit_waits(tmp_path: Path) -> None:
    # Rollback journal: a reader holding its lock keeps the COMMIT waiting, which
    # makes the moment between "the transaction has run" and "it is on disk" visible.
    store = make_store(tmp_path / "items.db", wal=False, busy_timeout=5)
    reader = await reader_holding_a_lock(store)
    told: list[tuple[str, int]] = []
    on_loop = asyncio.Event()

    def written(result: str) -> None:  # on the event loop's thread, with the result
        told.append((result, threading.get_ident()))
        on_loop.set()

    write = asyncio.ensure_future(store.write(insert("told"), written=written))
    await asyncio.wait_for(on_loop.wait(), 5)
    assert told[0] == ("told", threading.get_ident())
    await asyncio.sleep(0.05)
    assert not write.done()  # the COMMIT still waits for the reader
    reader.execute("COMMIT")
    reader.close()
    assert await asyncio.wait_for(write, 5) == "told"
    assert {result for result, _ in told} == {"told"}
    assert await names(store) == ["told"]
    await store.close()


async def test_a_write_told_its_result_can_still_fail_to_commit(tmp_path: Path) -> None:
    store = make_store(tmp_path / "items.db", wal=False, busy_timeout=0.3)
    reader = await reader_holding_a_lock(store)
    told: list[str] = []
    with pytest.raises(StoreBusyError, match="nothing was written"):
        await store.write(insert("blocked"), written=told.append)
    await asyncio.sleep(0)  # a last call may still be on its way to the loop
    assert told and set(told) == {"blocked"}  # told, once per attempt, and then it failed
    reader.execute("COMMIT")
    reader.close()
    assert await names(store) == []
    await store.close()


async def test_only_the_writes_that_ran_are_told(store: SQLiteStore) -> None:
    release, blocker = await hold_writer(store)
    told: list[str] = []

    def failing(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO items (name) VALUES ('half-done')")
        raise RuntimeError("tool exploded")

    jobs = [insert("first"), failing, insert("second")]
    tasks = [asyncio.ensure_future(store.write(fn, written=told.append)) for fn in jobs]
    await asyncio.sleep(0.05)
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await blocker
    await asyncio.sleep(0)
    assert results[0] == "first" and results[2] == "second"
    assert isinstance(results[1], RuntimeError)
    # The batch failed once and ran again, each write in its own savepoint: only then,
    # about to commit, were the writes that succeeded told -- once each.
    assert told == ["first", "second"]
    assert await names(store) == ["blocker", "first", "second"]


async def test_synchronous_full_and_a_busy_timeout_are_set(store: SQLiteStore) -> None:
    def pragmas(conn: sqlite3.Connection) -> tuple[int, int, str]:
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        busy = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
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

        def extra(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            return [tuple(r) for r in conn.execute("SELECT name, extra FROM items")]

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

    def write(name: str):  # type: ignore[no-untyped-def]
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO items (name) VALUES (?)", (name,))
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
