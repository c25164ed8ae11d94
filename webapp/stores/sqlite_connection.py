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
- a file written by a newer release is refused, never downgraded.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import aiosqlite

__all__ = [
    "LockWait",
    "Schema",
    "StoreBusyError",
    "StoreOpenError",
    "is_busy",
    "on_connection_thread",
    "open_connection",
    "retrying",
    "split_statements",
]

logger = logging.getLogger("webapp.stores.sqlite_connection")

T = TypeVar("T")

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


def split_statements(sql: str) -> list[str]:
    """Split a script into complete statements (semicolons inside literals or triggers kept).

    ``executescript`` would COMMIT the open transaction first, so schemas are
    run one statement at a time inside the store's own transaction instead.
    """
    statements: list[str] = []
    buf = ""
    for piece in sql.split(";"):
        buf += piece + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \t\r\n;"):
                statements.append(buf.strip())
            buf = ""
    if buf.strip(" \t\r\n;"):
        raise ValueError(f"schema SQL ends with an incomplete statement: {buf.strip()!r}")
    return statements


async def on_connection_thread(
    db: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]
) -> T:
    """Run ``fn`` on the plain connection, on its own thread: many statements, one trip.

    Every aiosqlite call is a round trip to the connection's thread and back,
    which costs about as much as a small write itself; a transaction of three
    calls paid that three times. aiosqlite has no public way to run several
    statements in one trip, so this uses ``Connection._execute``, the private
    method every one of its public calls goes through
    (``tests/stores/test_sqlite_speed_paths.py`` fails if an upgrade changes
    it). ``fn`` runs while the event loop goes on: it must not touch asyncio.
    """
    conn: sqlite3.Connection = db._conn
    result: T = await db._execute(fn, conn)
    return result


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


async def retrying(
    db: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T], wait: LockWait, doing: str
) -> T:
    """`on_connection_thread` of ``fn``, run again after a lock failure until ``wait``
    gives up (``fn`` must leave no transaction open when it fails)."""
    while True:
        try:
            return await on_connection_thread(db, fn)
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise
        await wait.pause(doing)


def _in_transaction(
    begin: str, fn: Callable[[sqlite3.Connection], T]
) -> Callable[[sqlite3.Connection], T]:
    """``fn`` between ``begin`` and COMMIT, rolled back if either fails."""

    def transaction(conn: sqlite3.Connection) -> T:
        conn.execute(begin)
        try:
            result = fn(conn)
            conn.execute("COMMIT")
            return result
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    return transaction


# --- schema -----------------------------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """A store's tables, recorded as ``(name, version)`` in ``schema_versions``.

    ``migrations`` maps an old version ``v`` to the statements that upgrade it
    to ``v + 1``. Several schemas (different names) may share one file.
    """

    name: str
    version: int
    statements: tuple[str, ...]
    migrations: Mapping[int, tuple[str, ...]]

    @classmethod
    def parse(
        cls, name: str, version: int, sql: str, migrations: Mapping[int, str] | None = None
    ) -> Schema:
        """Split ``sql`` and each migration into statements now, so a typo fails at once."""
        steps = {v: tuple(split_statements(m)) for v, m in (migrations or {}).items()}
        return cls(name, version, tuple(split_statements(sql)), steps)

    def apply(self, conn: sqlite3.Connection, path: str) -> None:
        """Create or migrate the tables; call inside an open write transaction."""
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_versions "
            "(name TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        rows = conn.execute(
            "SELECT version FROM schema_versions WHERE name = ?", (self.name,)
        ).fetchall()
        found = int(rows[0][0]) if rows else None
        if found is None:
            for statement in self.statements:
                conn.execute(statement)
        elif found > self.version:
            raise sqlite3.OperationalError(
                f"{path!r} holds {self.name!r} schema version {found}, newer than "
                f"this code's {self.version}; upgrade the application to open it"
            )
        else:
            for version in range(found, self.version):
                if version not in self.migrations:
                    raise sqlite3.OperationalError(
                        f"no migration for {self.name!r} from schema version {version} "
                        f"to {version + 1} in {path!r}"
                    )
                for statement in self.migrations[version]:
                    conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_versions (name, version) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET version = excluded.version",
            (self.name, self.version),
        )


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
        apply = _in_transaction("BEGIN IMMEDIATE", lambda conn: schema.apply(conn, path))
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
    pending = aiosqlite.connect(path, isolation_level=None, timeout=busy_timeout)
    # aiosqlite's worker thread is not a daemon, so a store nobody closed
    # would hang interpreter exit. Every write that returned has committed,
    # so letting exit stop the thread loses nothing.
    thread = getattr(pending, "_thread", None)
    if thread is not None and not thread.is_alive():
        thread.daemon = True
    return await pending


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
