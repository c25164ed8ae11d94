"""One SQLite file, one connection, one writer: the job queue every SQLite store shares.

`SQLiteStore` owns a single persistent aiosqlite connection (opened lazily by
`webapp.stores.sqlite_connection`, which also holds the schema and lock-wait
rules) and a single worker task, the only code that ever uses it, which runs
the jobs one at a time. `SQLiteBacked` is the base of a store built on one.
Callers hand it jobs:

- ``await store.read(fn)`` runs ``await fn(db)`` inside a read transaction, so
  a read of several statements sees one consistent state and never sees a
  write that has not committed;
- ``await store.write(fn)`` queues ``fn``; the worker drains every write
  queued at that moment into ONE ``BEGIN IMMEDIATE ... COMMIT`` (group
  commit: one fsync for many writes, which is what lets 50 tasks append
  thousands of segments a second with ``synchronous=FULL``). ``write``
  returns only once its transaction has committed, so it is on disk;
- ``await store.execute(sql, params)`` / ``await store.fetchall(sql, params)``
  are the one-statement forms; consecutive ``execute`` jobs with the same SQL
  in one batch share a single ``executemany``.

``fn`` is a coroutine function of the `aiosqlite.Connection`; it awaits each
statement through aiosqlite's public API (``execute``, ``executemany``,
``execute_fetchall``, a cursor's fetches). Whatever else it awaits holds up
every other job of the store, and the file's write lock, meanwhile.

Invariants, each named for the failure it prevents:
- one job at a time on the connection: a read can never run inside the
  writer's open transaction and see its uncommitted state;
- one failing write never takes its batch down: a batch first runs without
  savepoints (each one costs statements); if any write fails it is rolled
  back and re-run with each write inside its own SAVEPOINT, so the failing
  one rolls back alone and the others commit;
- retry only what provably never committed: SQLITE_BUSY at BEGIN, on a
  statement inside the open transaction (then rolled back), from a COMMIT
  that left the transaction open, or from a lone statement run as its own
  transaction (SQLite rolls that back when it cannot commit). Any other
  COMMIT failure is reported, never retried -- a retried checkpoint append
  would store a turn twice;
- bounded waits: SQLite's own busy handler waits up to ``busy_timeout`` per
  attempt, and the store gives up with `StoreBusyError` once ``busy_timeout``
  has passed overall;
- a transient open failure is ridden out (``OPEN_RETRY_DELAYS``): only the
  connect is retried, before any job has run, never a write that may have
  committed;
- a transaction is never left open: its callers wait on futures while the
  worker runs it, so a cancelled caller cannot stop it halfway, and the
  worker itself rolls back before it gives way to a cancellation.

Because a batch may be re-run, a write function must only act through the
``db`` it is given and keep no state outside it; encode values before calling
``write`` so that bad input fails in the caller, not in the batch. It must
not call its own store (it would wait for itself: refused with RuntimeError).
A caller cancelled while its write waits in the queue has it skipped; once
its batch has started the write commits (or fails) regardless.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self, TypeVar

import aiosqlite

from webapp.stores.codec import StoredDataError  # its home is the shared codec; named here too
from webapp.stores.sqlite_connection import (
    DbFn,
    LockWait,
    Schema,
    StoreBusyError,
    is_busy,
    open_connection,
    retrying,
    rollback,
)

__all__ = [
    "CommitFailedError",
    "SQLiteBacked",
    "SQLiteStore",
    "StoredDataError",
]

T = TypeVar("T")

MAX_BATCH = 256  # writes per transaction; bounds the work a re-run repeats


class CommitFailedError(RuntimeError):
    """COMMIT failed for a reason other than a lock: the writes may not be on disk."""


class _Retry(Exception):
    """Internal: the transaction was rolled back because of a lock; run it again."""


@dataclass
class _Job:
    kind: Literal["read", "write", "close"]
    future: asyncio.Future[Any]
    fn: DbFn[Any] | None = None
    sql: str | None = None  # a one-statement job: run with ``params`` instead of ``fn``
    params: Any = ()
    result: Any = None
    error: BaseException | None = None

    async def run(self, db: aiosqlite.Connection) -> Any:
        """The job's work: its function, or its one statement's rows."""
        if self.sql is not None:
            return list(await db.execute_fetchall(self.sql, self.params))
        assert self.fn is not None
        return await self.fn(db)

    async def read(self, db: aiosqlite.Connection) -> Any:
        """`run` as a read: a function in a read transaction (one statement is one)."""
        if self.sql is not None:
            return await self.run(db)
        await db.execute("BEGIN")
        try:
            return await self.run(db)
        finally:
            await rollback(db)  # a read transaction ends the same either way


class SQLiteStore:
    """A lazily opened SQLite file with one connection, serialized jobs and group commit.

    ``schema_name``/``schema_version``/``schema_sql`` declare this store's
    tables; the version is recorded in ``schema_versions(name, version)`` so a
    later release can migrate. ``migrations`` maps an old version ``v`` to the
    SQL that upgrades it to ``v + 1``. Several stores (with different schema
    names) may share one file; pass ``wal=True`` for that or for several
    processes.

    ``OPEN_RETRY_DELAYS`` are the pauses, in seconds, before each new attempt
    when opening the file fails transiently ("unable to open database file");
    their sum bounds how long a file that cannot be opened delays its error.

    Example -- a table of one's own in the app's database file::

        schema = "CREATE TABLE IF NOT EXISTS chats (id TEXT PRIMARY KEY, title TEXT);"
        chats = SQLiteStore(
            db_path, wal=True, schema_name="chats", schema_version=1, schema_sql=schema
        )
        await chats.execute("INSERT INTO chats (id, title) VALUES (?, ?)", (chat_id, title))
        rows = await chats.fetchall("SELECT id, title FROM chats ORDER BY id")

        async def rename(db: aiosqlite.Connection) -> int:  # several statements, one transaction
            cursor = await db.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))
            return cursor.rowcount

        changed = await chats.write(rename)
        await chats.close()
    """

    OPEN_RETRY_DELAYS: ClassVar[tuple[float, ...]] = (0.05, 0.1, 0.2, 0.4)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        wal: bool = False,
        schema_name: str,
        schema_version: int,
        schema_sql: str,
        migrations: Mapping[int, str] | None = None,
        busy_timeout: float = 10.0,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
    ) -> None:
        if busy_timeout <= 0:
            raise ValueError(
                f"busy_timeout must be a positive number of seconds, got {busy_timeout!r}"
            )
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        self.path = os.fspath(path)
        self.wal = wal
        self.schema_name = schema_name
        self.schema_version = schema_version
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous
        self._schema = Schema(schema_name, schema_version, schema_sql, migrations or {}).check()
        self._db: aiosqlite.Connection | None = None
        self._jobs: deque[_Job] = deque()
        self._worker: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.schema_name!r} path={self.path!r} wal={self.wal}>"

    # --- public API -----------------------------------------------------------

    async def read(self, fn: DbFn[T]) -> T:
        """``await fn(db)`` in a read transaction; run again if the file is locked."""
        return await self._submit("read", fn)  # type: ignore[no-any-return]

    async def write(self, fn: DbFn[T]) -> T:
        """``await fn(db)`` in a committed transaction (maybe shared with other writes);
        a re-run batch calls it again."""
        return await self._submit("write", fn)  # type: ignore[no-any-return]

    async def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> None:
        """Write one statement, committed like `write`.

        Consecutive ones with the same SQL in a batch share one ``executemany``
        call, the cheapest way to many small writes such as appends; one alone
        is its own transaction, with no BEGIN and COMMIT around it.
        """
        await self._submit("write", None, sql, params)

    async def fetchall(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[Any]:
        """Rows of one query (a single statement reads one consistent state)."""
        return await self._submit("read", None, sql, params)  # type: ignore[no-any-return]

    async def close(self) -> None:
        """Finish queued jobs and close the connection; idempotent, a later job reopens."""
        idle = self._worker is None or self._worker.done()
        if self._db is None and not self._jobs and idle:
            return
        await self._submit("close", None)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- the worker -------------------------------------------------------------

    async def _submit(
        self,
        kind: Literal["read", "write", "close"],
        fn: DbFn[Any] | None,
        sql: str | None = None,
        params: Any = (),
    ) -> Any:
        worker = self._worker
        if worker is not None and worker is asyncio.current_task():
            raise RuntimeError(
                f"a job of {self!r} called the same store: it would wait for itself. "
                "Do that work through the connection the job was given."
            )
        loop = asyncio.get_running_loop()
        job = _Job(kind, loop.create_future(), fn, sql, params)
        self._jobs.append(job)
        # A worker left behind by a closed event loop will never run again.
        if worker is None or worker.done() or worker.get_loop() is not loop:
            self._worker = loop.create_task(self._work())
        return await job.future

    async def _work(self) -> None:
        try:
            while self._jobs:
                head = self._jobs.popleft()
                if head.future.cancelled():
                    continue
                if head.kind == "write":
                    batch = self._take_writes(head)
                    await self._guarded(batch, self._run_writes(batch))
                elif head.kind == "read":
                    await self._guarded([head], self._run_read(head))
                else:
                    await self._guarded([head], self._close_now())
        finally:
            if self._worker is asyncio.current_task():
                self._worker = None

    def _take_writes(self, head: _Job) -> list[_Job]:
        """``head`` plus the writes queued behind it, up to a close or MAX_BATCH.

        Queued reads are passed over and served right after this batch: they
        come from other tasks, so no caller can tell, and reads interleaved
        with writes would otherwise cut every batch down to one write.
        """
        batch: list[_Job] = [head]
        rest: deque[_Job] = deque()
        while self._jobs and len(batch) < MAX_BATCH and self._jobs[0].kind != "close":
            job = self._jobs.popleft()
            if job.kind != "write":
                rest.append(job)
            elif not job.future.cancelled():
                batch.append(job)
        rest.extend(self._jobs)
        self._jobs = rest
        return batch

    async def _guarded(self, jobs: list[_Job], step: Awaitable[None]) -> None:
        """Run one step; whatever happens, every job's caller gets an answer."""
        try:
            await step
        except asyncio.CancelledError:
            for job in jobs:
                if not job.future.done():
                    job.future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 -- an unexpected failure goes to the callers
            self._fail(jobs, exc)
        for job in jobs:
            if job.future.done():
                continue
            if job.error is not None:
                job.future.set_exception(job.error)
            else:
                job.future.set_result(job.result)

    async def _close_now(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    # --- opening ----------------------------------------------------------------

    async def _connection(self) -> aiosqlite.Connection:
        if self._db is None:  # a closed or never-opened store opens on its next job
            self._db = await open_connection(
                self.path,
                self._schema,
                wal=self.wal,
                busy_timeout=self.busy_timeout,
                synchronous=self.synchronous,
                retry_delays=self.OPEN_RETRY_DELAYS,
            )
        return self._db

    # --- reads ------------------------------------------------------------------

    async def _run_read(self, job: _Job) -> None:
        try:
            db = await self._connection()
            wait = LockWait(self.path, self.busy_timeout)
            job.result = await retrying(db, job.read, wait, "reading")
        except Exception as exc:  # noqa: BLE001 -- the reader's own error, handed back to it
            job.error = exc

    # --- writes -----------------------------------------------------------------

    async def _run_writes(self, jobs: list[_Job]) -> None:
        """Commit ``jobs`` in one transaction; see the module docstring for the rules."""
        try:
            db = await self._connection()
        except Exception as exc:  # noqa: BLE001 -- every writer learns why the file won't open
            self._fail(jobs, exc)
            return
        wait = LockWait(self.path, self.busy_timeout)
        isolate = False
        pending = list(jobs)
        while pending:
            try:
                pending = await self._attempt(db, pending, isolate)
            except (sqlite3.OperationalError, _Retry) as exc:
                if isinstance(exc, sqlite3.OperationalError) and not is_busy(exc):
                    self._fail(pending, exc)  # nothing committed; the cause is not a lock
                    return
                try:
                    await wait.pause("writing")
                except StoreBusyError as busy:
                    self._fail(pending, busy)
                    return
                continue
            # Jobs left means a write failed and everything was rolled back: run
            # them again, each in its own savepoint.
            isolate = True

    @staticmethod
    def _fail(jobs: list[_Job], exc: BaseException) -> None:
        for job in jobs:
            job.error = exc
            job.result = None

    async def _attempt(
        self, db: aiosqlite.Connection, jobs: list[_Job], isolate: bool
    ) -> list[_Job]:
        """One pass over the batch in its own transaction, BEGIN to COMMIT.

        Returns the jobs to run again, each in its own savepoint (after a
        rollback, when a write failed), or ``[]`` once the batch is settled.
        Raises `_Retry` after rolling back because of a lock.
        """
        for job in jobs:
            job.error, job.result = None, None
        if len(jobs) == 1 and jobs[0].sql is not None:
            await _alone(db, jobs[0])
            return []
        await db.execute("BEGIN IMMEDIATE")
        try:
            again = await (_isolated(db, jobs) if isolate else _together(db, jobs))
            if again is not None:  # rolled back: nothing of the batch is written
                return again
            try:
                await db.execute("COMMIT")
            except sqlite3.Error as exc:
                retry = is_busy(exc) and db.in_transaction
                await rollback(db)
                self._commit_failed(jobs, exc, retry)
            return []
        except BaseException:
            await rollback(db)  # never leave the connection mid-transaction
            raise

    def _commit_failed(self, jobs: list[_Job], exc: sqlite3.Error, retry: bool) -> None:
        """After a failed COMMIT, rolled back: run the batch again, or report it."""
        if retry:
            # SQLite keeps the transaction open after a busy COMMIT: provably
            # not committed, so rolling back and running again is safe.
            raise _Retry from exc
        self._fail(jobs, CommitFailedError(_commit_message(self.path, exc)))


async def _alone(db: aiosqlite.Connection, job: _Job) -> None:
    """A lone one-statement write, outside any transaction: SQLite makes it a
    transaction of its own and commits it before it returns -- one await where
    BEGIN, the statement and COMMIT are three (an append's cost, beside its fsync).

    Raises `_Retry` for a lock: a statement that cannot commit is rolled back
    by SQLite itself, so a busy one provably never committed.
    """
    assert job.sql is not None
    try:
        await db.execute(job.sql, job.params)
    except Exception as exc:
        if is_busy(exc):
            raise _Retry from exc
        job.error = exc


async def _together(db: aiosqlite.Connection, jobs: list[_Job]) -> list[_Job] | None:
    """The batch's writes without savepoints: None once all ran, else (one failed and
    all was rolled back) the ones to run again."""
    index = 0
    while index < len(jobs):
        group = _same_statement(jobs, index)
        try:
            if len(group) > 1:
                await db.executemany(str(group[0].sql), [j.params for j in group])
            else:
                group[0].result = await group[0].run(db)
        except Exception as exc:  # noqa: BLE001 -- a lock is retried, the rest reported
            await rollback(db)
            return _after_failed_write(jobs, exc)
        index += len(group)
    return None


async def _isolated(db: aiosqlite.Connection, jobs: list[_Job]) -> list[_Job] | None:
    """Each write in its own savepoint, so a failing one rolls back alone: None once
    all ran, else (SQLite rolled everything back itself) the ones to run again."""
    for job in jobs:
        await db.execute("SAVEPOINT write")
        try:
            job.result = await job.run(db)
        except Exception as exc:
            if is_busy(exc):
                await rollback(db)
                raise _Retry from exc
            job.error = exc
            if not db.in_transaction:
                # SQLite rolled the whole transaction back itself: nothing
                # committed, so the others may simply run again.
                return [j for j in jobs if j is not job]
            await db.execute("ROLLBACK TO write")
        await db.execute("RELEASE write")
    return None


def _after_failed_write(jobs: list[_Job], exc: Exception) -> list[_Job]:
    """What to run again after a write failed on the fast path and all was rolled back.

    Raises `_Retry` for a lock; a lone write gets its error; in a batch every
    write runs again in its own savepoint, so the failing one fails alone.
    """
    if is_busy(exc):
        raise _Retry from exc
    if len(jobs) == 1:
        jobs[0].error = exc
        return []
    return jobs


def _same_statement(jobs: list[_Job], start: int) -> list[_Job]:
    """The run of jobs from ``start`` that share one SQL statement (at least one job)."""
    first = jobs[start]
    end = start + 1
    if first.sql is not None:
        while end < len(jobs) and jobs[end].sql == first.sql:
            end += 1
    return jobs[start:end]


class SQLiteBacked:
    """Base of a store whose tables live in one `SQLiteStore`: the lifecycle, written once.

    A subclass names its schema in ``SCHEMA_NAME``, ``SCHEMA_VERSION`` and
    ``SCHEMA_SQL`` (plus ``MIGRATIONS``: old version -> the SQL that upgrades
    it by one) and talks to ``self._store``.
    """

    SCHEMA_NAME: str
    SCHEMA_VERSION: int
    SCHEMA_SQL: str
    MIGRATIONS: ClassVar[Mapping[int, str]] = {}

    def __init__(
        self, path: str | os.PathLike[str], *, wal: bool = False, busy_timeout: float = 10.0
    ) -> None:
        self._store = SQLiteStore(
            path,
            wal=wal,
            schema_name=self.SCHEMA_NAME,
            schema_version=self.SCHEMA_VERSION,
            schema_sql=self.SCHEMA_SQL,
            migrations=self.MIGRATIONS,
            busy_timeout=busy_timeout,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._store.path!r}, wal={self._store.wal})"

    async def close(self) -> None:
        """Finish queued writes and close the file; idempotent, a later call reopens."""
        await self._store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _commit_message(path: str, exc: BaseException) -> str:
    return (
        f"COMMIT to {path!r} failed ({exc}); the writes of this batch may not be saved. "
        "They were not retried because a retry could store them twice: check the data "
        "(e.g. load the run) before writing again."
    )
