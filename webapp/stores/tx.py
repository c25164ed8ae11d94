"""One transaction API over SQLite or PostgreSQL, with the dialects' differences here.

Store and chat code writes its SQL once, with ``?`` placeholders, against `Tx`:
a transaction that fetches rows, executes statements, runs a schema script and
takes a named write lock. What differs between the two back ends is decided in
this module and nowhere else:

- placeholders: PostgreSQL's ``$1``, ``$2``... from ``?``, once per statement text
  (cached; the shared SQL has no ``?`` inside a string literal);
- row counts: SQLite's cursor, PostgreSQL's status tag ("UPDATE 3");
- scripts: SQLite runs one statement at a time inside the open transaction
  (``executescript`` would COMMIT it first), PostgreSQL the whole text at once;
- locks: PostgreSQL takes a transaction-level advisory lock per name, so two
  processes never interleave their writes to one session (or one schema);
  SQLite has one writer per file already, and takes nothing.

A parameter PostgreSQL cannot type from its context is written with a CAST in the
shared SQL (SQLite accepts the same CAST).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, Literal, Protocol

import aiosqlite
import asyncpg

Dialect = Literal["sqlite", "postgresql"]


class Tx(Protocol):
    """One open transaction of a store's database."""

    dialect: Dialect

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]: ...

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; returns how many rows it changed."""
        ...

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    async def script(self, sql: str) -> None:
        """Run a script of statements (a schema) inside the transaction."""
        ...

    async def lock(self, space: str, key: str) -> None:
        """Hold the write lock ``(space, key)`` against other processes until the end
        of the transaction."""
        ...


class SQLiteTx:
    """A transaction on a store's aiosqlite connection, opened and ended by the store."""

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

    async def script(self, sql: str) -> None:
        for statement in split_statements(sql):
            await self.db.execute(statement)

    async def lock(self, space: str, key: str) -> None:
        """Nothing to take: the file has one writer at a time, and this is it."""


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


_PLACEHOLDER = re.compile(r"\?")
_numbered: dict[str, str] = {}


def numbered(sql: str) -> str:
    """``?`` placeholders as PostgreSQL's ``$1``, ``$2``... (the shared SQL has no ``?``
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


LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))"
# A space's one lock (key ""): the second number 0, as the schema lock has always been,
# so a process of an older release starting beside this one waits for the same lock.
SPACE_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtext($1), 0)"


class PostgresTx:
    """A transaction on an asyncpg connection, opened and ended by the caller."""

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

    async def script(self, sql: str) -> None:
        await self.conn.execute(sql)  # no arguments: the simple protocol runs them all

    async def lock(self, space: str, key: str) -> None:
        if key:
            await self.conn.execute(LOCK_SQL, space, key)
        else:
            await self.conn.execute(SPACE_LOCK_SQL, space)
