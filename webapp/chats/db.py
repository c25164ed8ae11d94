"""The chat tables' database: one transaction API over SQLite or PostgreSQL.

The chat layer (`chat_store`, `chat_tree`, `chat_export`, `session_rows`)
writes its SQL once, with ``?`` placeholders, against `Tx`: a transaction
that fetches rows and executes statements. `open_chat_db` picks the back end
from the location: a file path is the SQLite file the app has always used
(one connection, group commit); a ``postgresql://`` URL is a pool on that
database, shared by any number of processes. Where the dialects differ (the
search index) the code asks ``tx.dialect``.

On SQLite a transaction is a job of the store's one connection
(`webapp.stores.sqlite.SQLiteStore`: writes serialized, queued ones committed
together): each statement is awaited through aiosqlite, one after another,
between the store's BEGIN and COMMIT. Whatever else a transaction function
awaits holds up the store's other jobs and the file's write lock meanwhile,
so it should await nothing but its ``tx``; it must not call the chat
database itself (refused: it would wait for itself).

The transaction itself, and every difference between the dialects
(placeholders, row counts, locks, scripts), is `webapp.stores.tx`'s: the
stores' own rules are written against the same `Tx`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from webapp.stores import (
    postgres_checkpoint,
    postgres_cluster,
    postgres_session,
    sqlite_checkpoint,
    sqlite_session,
)
from webapp.stores.postgres import PostgresBacked
from webapp.stores.sqlite import SQLiteBacked
from webapp.stores.tx import Dialect, PostgresTx, SQLiteTx, Tx, numbered

__all__ = [
    "ChatDatabase",
    "Dialect",
    "PostgresTx",
    "SQLiteTx",
    "Tx",
    "TxFn",
    "numbered",
    "open_chat_db",
]

T = TypeVar("T")
B = TypeVar("B", bound="_SQLiteChats | _PostgresChats")
TxFn = Callable[[Tx], Coroutine[Any, Any, T]]


class ChatDatabase(Protocol):
    dialect: Dialect

    async def read(self, fn: TxFn[T]) -> T: ...

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        """Rows of one statement (``?`` placeholders). One statement reads one consistent
        state by itself: no transaction is opened around it, which on SQLite saves two
        trips to the connection's thread (BEGIN, ROLLBACK) per read on a reply's path."""
        ...

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

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        return await self._store.fetchall(sql, params)

    async def write(self, fn: TxFn[T]) -> T:
        return await self._store.write(lambda db: fn(SQLiteTx(db)))


class _PostgresChats(PostgresBacked):
    dialect: Dialect = "postgresql"

    def __init__(self, dsn: str, max_connections: int = 10) -> None:
        super().__init__(dsn, max_connections=max_connections)

    async def read(self, fn: TxFn[T]) -> T:
        return await self._store.transaction(lambda conn: fn(PostgresTx(conn)))

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        return list(await self._store.fetch(numbered(sql), *params))

    async def write(self, fn: TxFn[T]) -> T:
        return await self._store.transaction(lambda conn: fn(PostgresTx(conn)))


# The other stores' tables, which the chat layer's transactions reach too (a chat's
# delete, its versions, the start-up sweep), in each dialect.
SQLITE_STORES = sqlite_session.SCHEMA_SQL + sqlite_checkpoint.SCHEMA_SQL
POSTGRES_STORES = postgres_session.SCHEMA_SQL + postgres_checkpoint.SCHEMA_SQL

# The run leases and event log of several processes, on PostgreSQL only: declared
# with the cluster (webapp.stores.postgres_cluster), created with the chat tables so
# the chat database's migrations stay in one place.
CLUSTER_TABLES = postgres_cluster.CLUSTER_TABLES
