"""The chat tables' database: one transaction API over SQLite or PostgreSQL.

The chat layer (`chat_store`, `chat_tree`, `chat_export`, `session_rows`)
writes its SQL once, with ``?`` placeholders, against `Tx`: a transaction
that fetches rows and executes statements. `open_chat_db` picks the back end
from the location: a file path is the SQLite file the app has always used
(one connection, group commit); a ``postgresql://`` URL is a pool on that
database, shared by any number of processes. Where the dialects differ (the
search index, a session append's lock) the code asks ``tx.dialect``.

On SQLite a transaction is a job of the store's one connection
(`webapp.stores.sqlite.SQLiteStore`: writes serialized, queued ones committed
together): each statement is awaited through aiosqlite, one after another,
between the store's BEGIN and COMMIT. Whatever else a transaction function
awaits holds up the store's other jobs and the file's write lock meanwhile,
so it should await nothing but its ``tx``; it must not call the chat
database itself (refused: it would wait for itself).

On PostgreSQL the ``?`` placeholders become ``$1``, ``$2``... once per
statement text (cached), and a statement's row count comes from its status
tag. A parameter PostgreSQL cannot type from its context is written with a
CAST in the shared SQL (SQLite accepts the same CAST).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

import aiosqlite
import asyncpg

from webapp.stores import postgres_checkpoint, postgres_session, sqlite_checkpoint, sqlite_session
from webapp.stores.postgres import PostgresBacked
from webapp.stores.sqlite import SQLiteBacked

T = TypeVar("T")
B = TypeVar("B", bound="_SQLiteChats | _PostgresChats")
Dialect = Literal["sqlite", "postgresql"]


class Tx(Protocol):
    """One open transaction of the chat database."""

    dialect: Dialect

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]: ...

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; returns how many rows it changed."""
        ...

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...


TxFn = Callable[[Tx], Coroutine[Any, Any, T]]


class SQLiteTx:
    """A transaction on the store's aiosqlite connection, opened and ended by the store."""

    dialect: Dialect = "sqlite"

    def __init__(self, db: aiosqlite.Connection) -> None:
        self.db = db

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        return list(await self.db.execute_fetchall(sql, params))

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        cursor = await self.db.execute(sql, params)
        return cursor.rowcount

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        batch = [tuple(r) for r in rows]
        if batch:  # nothing to send the connection's thread
            await self.db.executemany(sql, batch)


_PLACEHOLDER = re.compile(r"\?")
_numbered: dict[str, str] = {}


def numbered(sql: str) -> str:
    """``?`` placeholders as PostgreSQL's ``$1``, ``$2``... (the chat SQL has no ``?``
    inside a string literal)."""
    found = _numbered.get(sql)
    if found is None:
        count = iter(range(1, 1 << 16))
        found = _PLACEHOLDER.sub(lambda _: f"${next(count)}", sql)
        if len(_numbered) < 4096:
            _numbered[sql] = found
    return found


def _row_count(status: str) -> int:
    """Rows changed, from a status tag such as "UPDATE 3" or "INSERT 0 1"."""
    last = status.rpartition(" ")[2]
    return int(last) if last.isdigit() else 0


class PostgresTx:
    dialect: Dialect = "postgresql"

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        return list(await self.conn.fetch(numbered(sql), *params))

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return _row_count(await self.conn.execute(numbered(sql), *params))

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        batch = [tuple(r) for r in rows]
        if batch:
            await self.conn.executemany(numbered(sql), batch)


class ChatDatabase(Protocol):
    dialect: Dialect

    async def read(self, fn: TxFn[T]) -> T: ...

    async def write(self, fn: TxFn[T]) -> T:
        """``fn`` in a committed transaction."""
        ...

    async def close(self) -> None: ...


def is_postgres(location: str | os.PathLike[str]) -> bool:
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


Schema = tuple[str, int, str, Mapping[int, str]]  # name, version, SQL, migrations


def open_chat_db(
    location: str | os.PathLike[str],
    *,
    sqlite_schema: Schema,
    postgres_schema: Schema,
    max_connections: int = 10,
) -> ChatDatabase:
    """The chat tables at ``location``: a file path (SQLite, WAL) or a ``postgresql://`` URL
    (``max_connections`` at most)."""
    if is_postgres(location):
        return _backed(_PostgresChats, postgres_schema)(str(location), max_connections)
    return _backed(_SQLiteChats, sqlite_schema)(location)


def _backed(base: type[B], schema: Schema) -> type[B]:
    name, version, sql, migrations = schema
    attributes = {
        "SCHEMA_NAME": name,
        "SCHEMA_VERSION": version,
        "SCHEMA_SQL": sql,
        "MIGRATIONS": migrations,
    }
    return type(base.__name__, (base,), attributes)


class _SQLiteChats(SQLiteBacked):
    dialect: Dialect = "sqlite"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path, wal=True)  # WAL: the file is shared with the other stores

    async def read(self, fn: TxFn[T]) -> T:
        return await self._store.read(lambda db: fn(SQLiteTx(db)))

    async def write(self, fn: TxFn[T]) -> T:
        return await self._store.write(lambda db: fn(SQLiteTx(db)))


class _PostgresChats(PostgresBacked):
    dialect: Dialect = "postgresql"

    def __init__(self, dsn: str, max_connections: int = 10) -> None:
        super().__init__(dsn, max_connections=max_connections)

    async def read(self, fn: TxFn[T]) -> T:
        return await self._store.transaction(lambda conn: fn(PostgresTx(conn)))

    async def write(self, fn: TxFn[T]) -> T:
        return await self._store.transaction(lambda conn: fn(PostgresTx(conn)))


# The other stores' tables, which the chat layer's transactions reach too (a chat's
# delete, its versions, the start-up sweep), in each dialect.
SQLITE_STORES = sqlite_session.SCHEMA_SQL + sqlite_checkpoint.SCHEMA_SQL
POSTGRES_STORES = postgres_session.SCHEMA_SQL + postgres_checkpoint.SCHEMA_SQL

# The run leases and event log of several processes (webapp.web.live.cluster), on
# PostgreSQL only: the chat database owns every table, so its migrations stay in one place.
CLUSTER_TABLES = """
CREATE TABLE IF NOT EXISTS run_leases (
    run_id     TEXT PRIMARY KEY,
    chat_id    TEXT NOT NULL,
    owner      TEXT NOT NULL,
    epoch      TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS run_leases_by_owner ON run_leases (owner);
CREATE TABLE IF NOT EXISTS run_events (
    run_id     TEXT NOT NULL,
    epoch      TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    event      TEXT NOT NULL,
    data       TEXT NOT NULL,
    delta      TEXT,
    written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, epoch, seq)
);
CREATE INDEX IF NOT EXISTS run_events_by_time ON run_events (written_at);
"""
