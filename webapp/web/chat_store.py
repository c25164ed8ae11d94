"""The chats table: titles, times and the run in flight, next to the session data.

A chat's conversation lives in the Session (session_id = chat id) and the run
in flight in its checkpoint; this table adds what only the web app needs:
- ``active_run_id`` -- the run the server owes the chat. It is set before the
  run starts and cleared only after the run's outcome is durable in the
  session, so a restart always knows which checkpoint to resume;
- ``stop_requested_run_id`` -- written before a Stop cancels the run, so a
  crash in the middle of a stop finishes the stop on restart instead of
  resuming a run the user stopped;
- the ``sends`` table maps (chat, client message id) to the run it started,
  so a retried POST or a double click never starts a second run.

The file is the app's own, so deleting a chat removes its session segments
and run checkpoints here too, in the same transaction as its row: a crash
can never leave half a chat behind. `sweep` removes what older versions
could leave (segments or checkpoints with no chat to own them).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import aiosqlite

from webapp.stores.sqlite import SQLiteBacked

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    active_run_id TEXT,
    stop_requested_run_id TEXT
);
CREATE INDEX IF NOT EXISTS chats_by_update ON chats (updated_at DESC);
CREATE TABLE IF NOT EXISTS sends (
    chat_id TEXT NOT NULL,
    client_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (chat_id, client_id)
);
CREATE INDEX IF NOT EXISTS sends_by_client ON sends (client_id);
"""

# The other stores' tables in the same file (webapp.stores.sqlite_session and
# sqlite_checkpoint): a chat's delete and the start-up sweep reach them here.
_SESSION_TABLE = "session_segments"
_CHECKPOINT_TABLES = ("checkpoint_heads", "checkpoint_entries")

_COLUMNS = "id, title, created_at, updated_at, active_run_id, stop_requested_run_id"


@dataclass(frozen=True)
class Chat:
    id: str
    title: str
    created_at: float
    updated_at: float
    active_run_id: str | None = None
    stop_requested_run_id: str | None = None

    @property
    def display_title(self) -> str:
        return self.title or "New chat"


def _chat(row: Any) -> Chat:
    return Chat(str(row[0]), str(row[1]), float(row[2]), float(row[3]), row[4], row[5])


class ChatStore(SQLiteBacked):
    """Chat metadata in the shared SQLite file (one connection, group commit)."""

    SCHEMA_NAME = "webapp_chats"
    SCHEMA_VERSION = 2
    SCHEMA_SQL = _SCHEMA
    MIGRATIONS: ClassVar[Mapping[int, str]] = {
        1: "CREATE INDEX IF NOT EXISTS sends_by_client ON sends (client_id);"
    }

    def __init__(self, path: str | os.PathLike[str], *, wal: bool = True) -> None:
        super().__init__(path, wal=wal)  # WAL by default: it shares the file with the stores

    async def create(self, title: str = "") -> Chat:
        now = time.time()
        chat = Chat(uuid.uuid4().hex, title, now, now)

        async def insert(db: aiosqlite.Connection) -> None:
            await db.execute(
                "INSERT INTO chats (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
                (chat.id, chat.title, chat.created_at, chat.updated_at),
            )

        await self._store.write(insert)
        return chat

    async def get(self, chat_id: str) -> Chat | None:
        async def select(db: aiosqlite.Connection) -> Chat | None:
            rows = list(
                await db.execute_fetchall(f"SELECT {_COLUMNS} FROM chats WHERE id = ?", (chat_id,))
            )
            return _chat(rows[0]) if rows else None

        return await self._store.read(select)

    async def recent(self, limit: int = 200) -> list[Chat]:
        """Most recently updated first."""

        async def select(db: aiosqlite.Connection) -> list[Chat]:
            rows = await db.execute_fetchall(
                f"SELECT {_COLUMNS} FROM chats ORDER BY updated_at DESC, id LIMIT ?", (limit,)
            )
            return [_chat(r) for r in rows]

        return await self._store.read(select)

    async def with_active_run(self) -> list[Chat]:
        async def select(db: aiosqlite.Connection) -> list[Chat]:
            rows = await db.execute_fetchall(
                f"SELECT {_COLUMNS} FROM chats WHERE active_run_id IS NOT NULL"
            )
            return [_chat(r) for r in rows]

        return await self._store.read(select)

    async def rename(self, chat_id: str, title: str) -> bool:
        return await self._update(chat_id, "title = ?, updated_at = ?", (title, time.time()))

    async def delete(self, chat_id: str, run_ids: list[str]) -> bool:
        """Delete the chat, its sends, its session and the checkpoints of ``run_ids``,
        in one transaction."""

        async def remove(db: aiosqlite.Connection) -> bool:
            tables = await _existing_tables(db)
            if _SESSION_TABLE in tables:
                await db.execute(f"DELETE FROM {_SESSION_TABLE} WHERE session_id = ?", (chat_id,))
            for table in _CHECKPOINT_TABLES:
                if table in tables:
                    await db.executemany(
                        f"DELETE FROM {table} WHERE run_id = ?", [(r,) for r in run_ids]
                    )
            await db.execute("DELETE FROM sends WHERE chat_id = ?", (chat_id,))
            cursor = await db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))
            return cursor.rowcount > 0

        return await self._store.write(remove)

    async def sweep(self) -> int:
        """Delete segments of chats that no longer exist and checkpoints no chat owes;
        returns how many rows went. Only safe before any run starts (at start-up)."""

        async def remove(db: aiosqlite.Connection) -> int:
            tables = await _existing_tables(db)
            removed = 0
            if _SESSION_TABLE in tables:
                cursor = await db.execute(
                    f"DELETE FROM {_SESSION_TABLE} WHERE session_id NOT IN (SELECT id FROM chats)"
                )
                removed += cursor.rowcount
            for table in _CHECKPOINT_TABLES:
                if table in tables:
                    cursor = await db.execute(
                        f"DELETE FROM {table} WHERE run_id NOT IN (SELECT active_run_id "
                        "FROM chats WHERE active_run_id IS NOT NULL)"
                    )
                    removed += cursor.rowcount
            return removed

        return await self._store.write(remove)

    async def find_send(self, client_id: str) -> tuple[str, str] | None:
        """(chat_id, run_id) of the run a client message id started, in any chat."""

        async def select(db: aiosqlite.Connection) -> tuple[str, str] | None:
            rows = list(
                await db.execute_fetchall(
                    "SELECT chat_id, run_id FROM sends WHERE client_id = ? "
                    "ORDER BY created_at LIMIT 1",
                    (client_id,),
                )
            )
            return (str(rows[0][0]), str(rows[0][1])) if rows else None

        return await self._store.read(select)

    async def sent_run(self, chat_id: str, client_id: str) -> str | None:
        """The run a client message id already started, if any."""

        async def select(db: aiosqlite.Connection) -> str | None:
            rows = list(
                await db.execute_fetchall(
                    "SELECT run_id FROM sends WHERE chat_id = ? AND client_id = ?",
                    (chat_id, client_id),
                )
            )
            return str(rows[0][0]) if rows else None

        return await self._store.read(select)

    async def begin_run(
        self, chat_id: str, run_id: str, *, client_id: str | None = None, title: str | None = None
    ) -> None:
        """Record the run in flight (and the client id that asked) in one transaction."""
        now = time.time()

        async def begin(db: aiosqlite.Connection) -> None:
            if client_id is not None:
                await db.execute(
                    "INSERT INTO sends (chat_id, client_id, run_id, created_at) VALUES (?, ?, ?, ?)",
                    (chat_id, client_id, run_id, now),
                )
            await db.execute(
                "UPDATE chats SET active_run_id = ?, stop_requested_run_id = NULL, "
                "updated_at = ?, title = CASE WHEN title = '' AND ? IS NOT NULL THEN ? "
                "ELSE title END WHERE id = ?",
                (run_id, now, title, title, chat_id),
            )

        await self._store.write(begin)

    async def request_stop(self, chat_id: str, run_id: str) -> None:
        await self._update(chat_id, "stop_requested_run_id = ?", (run_id,))

    async def end_run(self, chat_id: str, run_id: str) -> None:
        """Clear the run in flight, only if it is still this run."""

        async def end(db: aiosqlite.Connection) -> None:
            await db.execute(
                "UPDATE chats SET active_run_id = NULL, stop_requested_run_id = NULL, "
                "updated_at = ? WHERE id = ? AND active_run_id = ?",
                (time.time(), chat_id, run_id),
            )

        await self._store.write(end)

    async def _update(self, chat_id: str, assignments: str, params: tuple[Any, ...]) -> bool:
        async def update(db: aiosqlite.Connection) -> bool:
            cursor = await db.execute(
                f"UPDATE chats SET {assignments} WHERE id = ?", (*params, chat_id)
            )
            return cursor.rowcount > 0

        return await self._store.write(update)


async def _existing_tables(db: aiosqlite.Connection) -> set[str]:
    rows = await db.execute_fetchall("SELECT name FROM sqlite_master WHERE type = 'table'")
    return {str(r[0]) for r in rows}
