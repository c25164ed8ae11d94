"""One SQLite connection: opening it, and transactions that wait out other connections' locks.

`open_connection` connects, sets the pragmas and brings a store's `Schema` up
to date; `SQLiteStore` (in `webapp.stores.sqlite`) owns the connection it
returns and serializes every job on it.

Invariants, each named for the failure it prevents:
- a transient open is ridden out: "unable to open database file" at connect
  (file descriptors run out, a directory is being recreated or mounted) is
  retried a few times with a short backoff, each retry logged at WARNING.
  Only the connect is retried -- nothing has been written by then -- and the
  last failure says what to check;
- bounded lock waits: SQLITE_BUSY is retried with backoff until
  ``busy_timeout`` has passed overall, then `StoreBusyError`;
- tables and their version move together: a schema is created or migrated in
  the same transaction that records it in ``schema_versions``, so a crash
  never leaves tables without a version, or a version without its tables;
- a file written by a newer release is refused, never downgraded;
- a store nobody closed never hangs interpreter exit: the connection's
  thread is a daemon (see `_daemon_made`).

Everything goes through aiosqlite's public API: each statement is one
``await`` on the connection (a trip to its thread and back), and a
transaction is BEGIN, its statements and COMMIT awaited one after another.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import aiosqlite

from webapp.stores.migrations import Schema
from webapp.stores.tx import SQLiteTx, split_statements

__all__ = [
    "DbFn",
    "LockWait",
    "Schema",
    "StoreBusyError",
    "StoreOpenError",
    "is_busy",
    "open_connection",
    "retrying",
    "rollback",
    "split_statements",
]

logger = logging.getLogger("webapp.stores.sqlite_connection")

T = TypeVar("T")
DbFn = Callable[[aiosqlite.Connection], Awaitable[T]]

_BACKOFF_START = 0.002
_BACKOFF_MAX = 0.05


class StoreBusyError(RuntimeError):
    """The database stayed locked by another connection past the busy timeout."""


class StoreOpenError(sqlite3.OperationalError):
    """The database file could not be opened; the message says what to check."""


def is_busy(exc: BaseException) -> bool:
    """True when ``exc`` is SQLITE_BUSY ("database is locked"), a transient lock wait."""
    return _has_code(exc, sqlite3.SQLITE_BUSY, "database is locked")


def _cannot_open(exc: BaseException) -> bool:
    return _has_code(exc, sqlite3.SQLITE_CANTOPEN, "unable to open database file")


def _has_code(exc: BaseException, primary: int, message: str) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) == primary  # extended codes keep the primary one in the low byte
    return message in str(exc)


# --- lock waits -------------------------------------------------------------------


class LockWait:
    """Backoff between attempts while another connection holds the lock, bounded overall."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.tries = 0

    async def pause(self, doing: str) -> None:
        """Sleep before the next attempt; `StoreBusyError` once ``timeout`` has passed."""
        self.tries += 1
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise StoreBusyError(
                f"{self.path!r} stayed locked by another connection for more than "
                f"{self.timeout:g} s while {doing}; nothing was written. Another process "
                "may hold a long transaction: retry later or raise busy_timeout."
            )
        await asyncio.sleep(min(_BACKOFF_MAX, remaining, _BACKOFF_START * 2 ** min(self.tries, 10)))


async def retrying(db: aiosqlite.Connection, fn: DbFn[T], wait: LockWait, doing: str) -> T:
    """``await fn(db)``, run again after a lock failure until ``wait`` gives up
    (``fn`` must leave no transaction open when it fails)."""
    while True:
        try:
            return await fn(db)
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise
        await wait.pause(doing)


async def rollback(db: aiosqlite.Connection) -> None:
    """Roll back the open transaction, if there is one.

    ``Connection.rollback`` does nothing outside a transaction, and it waits
    its turn behind whatever was sent to the connection's thread before it:
    called after a cancelled ``await`` (whose statement may still be running
    there, a BEGIN waiting on a lock, say), it still ends what that began.
    """
    await db.rollback()


def _in_transaction(begin: str, fn: DbFn[T]) -> DbFn[T]:
    """``fn`` between ``begin`` and COMMIT, rolled back if either fails."""

    async def transaction(db: aiosqlite.Connection) -> T:
        await db.execute(begin)
        try:
            result = await fn(db)
            await db.execute("COMMIT")
        except BaseException:
            # Also on a cancellation, so the connection is never left mid-transaction.
            await rollback(db)
            raise
        return result

    return transaction


# --- schema -----------------------------------------------------------------------


# --- opening ----------------------------------------------------------------------


async def open_connection(
    path: str,
    schema: Schema,
    *,
    wal: bool,
    busy_timeout: float,
    synchronous: str,
    retry_delays: Sequence[float],
) -> aiosqlite.Connection:
    """Connect (riding out a transient open failure), set the pragmas, apply ``schema``.

    ``retry_delays`` are the pauses, in seconds, between connect attempts. On
    any failure after the connect the connection is closed again.
    """
    db = await _connect(path, busy_timeout, retry_delays)
    try:
        await _configure(db, path, wal=wal, busy_timeout=busy_timeout, synchronous=synchronous)
        apply = _in_transaction(
            "BEGIN IMMEDIATE", lambda conn: schema.apply(SQLiteTx(conn), repr(path))
        )
        await retrying(db, apply, LockWait(path, busy_timeout), "running a transaction")
    except BaseException:
        await db.close()
        raise
    return db


async def _connect(
    path: str, busy_timeout: float, retry_delays: Sequence[float]
) -> aiosqlite.Connection:
    attempts = len(retry_delays) + 1
    for attempt in range(1, attempts + 1):
        try:
            return await _connect_once(path, busy_timeout)
        except sqlite3.Error as exc:
            if not _cannot_open(exc) or attempt == attempts:
                raise StoreOpenError(_open_failed_message(path, exc, attempt)) from exc
            delay = retry_delays[attempt - 1]
            logger.warning(
                "could not open SQLite database %r (attempt %d of %d): %s; retrying in %g s",
                path,
                attempt,
                attempts,
                exc,
                delay,
            )
            await asyncio.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _connect_once(path: str, busy_timeout: float) -> aiosqlite.Connection:
    if path != ":memory:" and not path.startswith("file:"):
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            # Checked here because SQLite's own message would not name the folder.
            # Worded as SQLite's, so it is retried like any failed open: the
            # folder may be on its way (a volume being mounted).
            raise sqlite3.OperationalError(
                f"unable to open database file: directory {folder!r} does not exist"
            )
    pending = _daemon_made(
        lambda: aiosqlite.connect(path, isolation_level=None, timeout=busy_timeout)
    )
    return await pending  # the connect itself, on the connection's own thread


def _daemon_made(make: Callable[[], T]) -> T:
    """``make()``, called on a short-lived daemon thread.

    aiosqlite gives each connection a thread of its own, created with the
    connection object and not marked as a daemon, so a store nobody closed
    would keep the interpreter from exiting. A new thread is a daemon when
    the thread creating it is one (`threading.Thread`'s documented default),
    so the connection is created on one (tests/stores/test_sqlite_processes.py
    fails if a release of aiosqlite creates its thread later). Every write that
    returned has committed, so letting exit stop that thread loses nothing.
    """
    made: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            made.append(make())
        except BaseException as exc:  # noqa: BLE001 -- raised again in the caller's thread
            failed.append(exc)

    maker = threading.Thread(target=run, name="aiosqlite connect", daemon=True)
    maker.start()
    maker.join()  # creating the object does no I/O: the thread ends at once
    if failed:
        raise failed[0]
    return made[0]


def _open_failed_message(path: str, exc: BaseException, attempts: int) -> str:
    tried = f" (tried {attempts} times)" if attempts > 1 else ""
    return (
        f"cannot open SQLite database {path!r}: {exc}{tried}. Check that its directory "
        "exists and is writable by this process, or choose another path."
    )


async def _configure(
    db: aiosqlite.Connection, path: str, *, wal: bool, busy_timeout: float, synchronous: str
) -> None:
    await db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    if wal:
        wait = LockWait(path, busy_timeout)
        while True:
            try:
                rows = await db.execute_fetchall("PRAGMA journal_mode = WAL")
                break
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    raise
            await wait.pause("switching to WAL mode")
        mode = str(next(iter(rows))[0]).lower()
        if mode not in ("wal", "memory"):
            raise sqlite3.OperationalError(
                f"could not switch {path!r} to WAL journal mode (it is {mode!r})"
            )
    # Set explicitly: an append that has returned must be on disk.
    await db.execute(f"PRAGMA synchronous = {synchronous}")
