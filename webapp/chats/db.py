"""The chat tables' database: one transaction API over SQLite or PostgreSQL.

The chat layer (`chat_store`, `chat_tree`, `chat_export`, `session_rows`)
writes its SQL once, with ``?`` placeholders, against `Tx`: a transaction
that fetches rows and executes statements. `open_chat_db` picks the back end
from the location: a file path is the SQLite file the app has always used
(one connection, group commit); a ``postgresql://`` URL is a pool on that
database, shared by any number of processes. Where the dialects differ (the
search index, a session append's lock) the code asks ``tx.dialect``.

On SQLite a transaction runs whole on the connection's own thread: its
function is a coroutine, but the `Tx` it is handed there runs each statement
at once, so it never suspends and `run_to_end` drives it in one go. That is
one trip to the thread per transaction, not one per statement (each trip
waits for the event loop's thread to let go of the GIL). A transaction
function must therefore await nothing but its ``tx``.

On PostgreSQL the ``?`` placeholders become ``$1``, ``$2``... once per
statement text (cached), and a statement's row count comes from its status
tag. A parameter PostgreSQL cannot type from its context is written with a
CAST in the shared SQL (SQLite accepts the same CAST).
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

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
    """A transaction on the plain connection, on its own thread: nothing here suspends."""

    dialect: Dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        return self.conn.execute(sql, params).fetchall()

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.conn.execute(sql, params).rowcount

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)


def run_to_end(fn: TxFn[T], conn: sqlite3.Connection) -> T:
    """``fn`` on a `SQLiteTx` of ``conn``, driven to its end here and now."""
    work = fn(SQLiteTx(conn))
    try:
        work.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    work.close()
    raise RuntimeError(
        f"{fn!r} awaited something besides its transaction; a transaction function "
        "must await only its tx (it runs whole on the database's thread)"
    )


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
    location: str | os.PathLike[str], *, sqlite_schema: Schema, postgres_schema: Schema
) -> ChatDatabase:
    """The chat tables at ``location``: a file path (SQLite, WAL) or a ``postgresql://`` URL."""
    if is_postgres(location):
        return _backed(_PostgresChats, postgres_schema)(str(location))
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
        return await self._store.read(lambda conn: run_to_end(fn, conn))

    async def write(self, fn: TxFn[T]) -> T:
        return await self._store.write(lambda conn: run_to_end(fn, conn))


class _PostgresChats(PostgresBacked):
    dialect: Dialect = "postgresql"

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, max_connections=10)

    async def read(self, fn: TxFn[T]) -> T:
        return await self._store.transaction(lambda conn: fn(PostgresTx(conn)))

    async def write(self, fn: TxFn[T]) -> T:
        return await self._store.transaction(lambda conn: fn(PostgresTx(conn)))


# The other stores' tables, which the chat layer's transactions reach too (a chat's
# delete, its versions, the start-up sweep), in each dialect.
SQLITE_STORES = sqlite_session.SCHEMA_SQL + sqlite_checkpoint.SCHEMA_SQL
POSTGRES_STORES = postgres_session.SCHEMA_SQL + postgres_checkpoint.SCHEMA_SQL
