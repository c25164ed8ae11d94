"""One person's chats as a library: the list, search, files, rename and delete.

`ChatLibrary` is the half of `webapp.chats.store.ChatStore` that finds and
files whole chats; the other half records runs and versions. Every method
here takes the `Owner` it acts for, and every query filters by it: another
person's chat is not found, exactly as a chat that does not exist, so no
caller above can forget the check (SPEC §13).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from webapp.chats import attachments, file_format, share_rows, tool_approvals
from webapp.chats import search as chat_search
from webapp.chats import search_pg as chat_search_pg
from webapp.chats.db import ChatDatabase, Dialect, Tx
from webapp.chats.file_export import ExportedFile
from webapp.chats.file_format import ChatFile
from webapp.chats.search import SearchHit
from webapp.chats.users import Owner, delete_account

CHAT_COLUMNS = (
    "id, title, created_at, updated_at, active_run_id, stop_requested_run_id, continues_run_id"
)

# What a run in flight resumes from, dropped with it: its checkpoint, the input it
# was started with (`begin_run` writes it with the run, before the run's first
# checkpoint can exist), whether it waits for a tool approval, the text its turn in
# flight streamed (webapp.stores.streamed), and the attachments it was started with.
CHECKPOINT_TABLES = (
    "checkpoint_heads",
    "checkpoint_entries",
    "run_inputs",
    "paused_runs",
    "checkpoint_partials",
    "run_files",
)


@dataclass(frozen=True)
class Chat:
    id: str
    title: str
    created_at: float
    updated_at: float
    active_run_id: str | None = None
    stop_requested_run_id: str | None = None
    continues_run_id: str | None = None  # the reply the active run continues
    from_api: bool = False  # a program made it through the API (SPEC §16); read by `recent`

    @property
    def display_title(self) -> str:
        return self.title or "New chat"


def chat_from_row(row: Any) -> Chat:
    return Chat(str(row[0]), str(row[1]), float(row[2]), float(row[3]), row[4], row[5], row[6])


async def delete_checkpoints(tx: Tx, run_ids: list[str]) -> None:
    for table in CHECKPOINT_TABLES:
        await tx.executemany(f"DELETE FROM {table} WHERE run_id = ?", [(r,) for r in run_ids])


async def owns(tx: Tx, owner: Owner, chat_id: str) -> bool:
    """Whether ``chat_id`` is one of ``owner``'s chats (every chat is `EVERY_CHAT`'s)."""
    if owner.user_id is None:
        return True
    rows = await tx.fetch(
        "SELECT 1 FROM chats WHERE id = ? AND user_id = ?", (chat_id, owner.user_id)
    )
    return bool(rows)


async def _remove_chat(tx: Tx, chat_id: str, run_ids: list[str]) -> bool:
    await tx.execute("DELETE FROM session_segments WHERE session_id = ?", (chat_id,))
    await delete_checkpoints(tx, run_ids)
    await tx.execute("DELETE FROM chat_runs WHERE chat_id = ?", (chat_id,))
    await tx.execute("DELETE FROM sends WHERE chat_id = ?", (chat_id,))
    await tool_approvals.forget_chat(tx, chat_id)
    await attachments.forget_chat(tx, chat_id)
    await share_rows.forget_chat(tx, chat_id)  # its link goes with it, at once
    return await tx.execute("DELETE FROM chats WHERE id = ?", (chat_id,)) > 0


class ChatLibrary:
    """Whole chats of one owner (mixed into `ChatStore`, whose database it uses)."""

    _store: ChatDatabase
    dialect: Dialect

    async def create(self, owner: Owner, title: str = "") -> Chat:
        now = time.time()
        chat = Chat(uuid.uuid4().hex, title, now, now)

        async def insert(tx: Tx) -> None:
            await tx.execute(
                "INSERT INTO chats (id, title, created_at, updated_at, user_id) "
                "VALUES (?, ?, ?, ?, ?)",
                (chat.id, chat.title, chat.created_at, chat.updated_at, owner.user_id),
            )

        await self._store.write(insert)
        return chat

    async def get(self, owner: Owner, chat_id: str) -> Chat | None:
        where, params = owner.condition()

        async def select(tx: Tx) -> Chat | None:
            rows = await tx.fetch(
                f"SELECT {CHAT_COLUMNS} FROM chats WHERE id = ?{where}", (chat_id, *params)
            )
            return chat_from_row(rows[0]) if rows else None

        return await self._store.read(select)

    async def recent(self, owner: Owner, limit: int = 200) -> list[Chat]:
        """Most recently updated first."""
        where = "AND user_id = ? " if owner.user_id is not None else ""
        params = (owner.user_id,) if owner.user_id is not None else ()
        # A program's conversation is listed when it asked to store it ("API"), and
        # kept out of the list otherwise (webapp.chats.api_access).
        sql = (
            f"SELECT {CHAT_COLUMNS}, (SELECT MIN(a.hidden) FROM api_runs a "
            "WHERE a.chat_id = chats.id) AS api FROM chats "
            "WHERE NOT EXISTS (SELECT 1 FROM api_runs h WHERE h.chat_id = chats.id "
            f"AND h.hidden = 1) {where}ORDER BY updated_at DESC, id LIMIT ?"
        )

        async def select(tx: Tx) -> list[Chat]:
            rows = await tx.fetch(sql, (*params, limit))
            return [replace(chat_from_row(r), from_api=r[7] is not None) for r in rows]

        return await self._store.read(select)

    async def rename(self, owner: Owner, chat_id: str, title: str) -> bool:
        where, params = owner.condition()
        sql = f"UPDATE chats SET title = ?, updated_at = ? WHERE id = ?{where}"
        return (
            await self._store.write(
                lambda tx: tx.execute(sql, (title, time.time(), chat_id, *params))
            )
            > 0
        )

    async def delete(self, owner: Owner, chat_id: str, run_ids: list[str]) -> bool:
        """Delete the chat, its sends, its session and the checkpoints of ``run_ids``,
        in one transaction."""

        async def remove(tx: Tx) -> bool:
            return await owns(tx, owner, chat_id) and await _remove_chat(tx, chat_id, run_ids)

        return await self._store.write(remove)

    async def export(self, owner: Owner, chat_id: str) -> ChatFile | None:
        async def read(tx: Tx) -> ChatFile | None:
            found = (
                await file_format.read_chat(tx, chat_id) if await owns(tx, owner, chat_id) else None
            )
            if found is None:
                return None
            files = [
                ExportedFile(f.id, f.name, f.media_type, f.data)
                for f in await attachments.chat_files(tx, chat_id)
            ]
            project = await tx.fetch(
                "SELECT p.name FROM chats c JOIN projects p ON p.id = c.project_id WHERE c.id = ?",
                (chat_id,),
            )
            return replace(found, files=files, project=str(project[0][0]) if project else None)

        return await self._store.read(read)

    async def import_chat(
        self, owner: Owner, chat: ChatFile, files: Sequence[attachments.NewFile] = ()
    ) -> str:
        """A validated chat file as a new chat of ``owner``, with the ``files`` read from
        it, in one transaction; returns its id."""

        async def store(tx: Tx) -> str:
            chat_id = await file_format.store_import(tx, chat)
            await attachments.store_new(tx, files)
            await attachments.link(
                tx,
                chat_id,
                [
                    a
                    for run in chat.runs
                    for e in run.entries
                    for a in getattr(e, "attachments", ())
                ],
            )
            await tx.execute("UPDATE chats SET user_id = ? WHERE id = ?", (owner.user_id, chat_id))
            if chat.project:  # into the importer's project of that name, if there is one
                where, params = owner.condition()
                found = await tx.fetch(
                    f"SELECT id FROM projects WHERE name = ?{where} ORDER BY created_at, id LIMIT 1",
                    (chat.project, *params),
                )
                if found:
                    await tx.execute(
                        "UPDATE chats SET project_id = ? WHERE id = ?", (found[0][0], chat_id)
                    )
            return chat_id

        return await self._store.write(store)

    async def search(self, owner: Owner, text: str) -> list[SearchHit]:
        found = chat_search_pg if self.dialect == "postgresql" else chat_search
        return await self._store.read(lambda tx: found.search(tx, text, owner))

    async def find_send(self, owner: Owner, client_id: str) -> tuple[str, str] | None:
        """(chat_id, run_id) of the run a client message id started, in any of the
        owner's chats."""
        where, params = owner.condition("c.user_id")

        async def select(tx: Tx) -> tuple[str, str] | None:
            rows = await tx.fetch(
                "SELECT s.chat_id, s.run_id FROM sends s JOIN chats c ON c.id = s.chat_id "
                f"WHERE s.client_id = ?{where} ORDER BY s.created_at LIMIT 1",
                (client_id, *params),
            )
            return (str(rows[0][0]), str(rows[0][1])) if rows else None

        return await self._store.read(select)

    async def remove_user(self, user_id: str) -> int:
        """Delete an account, its sessions, and its chats with all they hold, in one
        transaction; returns how many chats went."""

        async def remove(tx: Tx) -> int:
            chats = await tx.fetch(
                "SELECT id, active_run_id FROM chats WHERE user_id = ?", (user_id,)
            )
            for chat_id, active in chats:
                runs = await tx.fetch(
                    "SELECT run_id FROM chat_runs WHERE chat_id = ? UNION "
                    "SELECT run_id FROM session_segments WHERE session_id = ?",
                    (chat_id, chat_id),
                )
                run_ids = [str(r[0]) for r in runs] + ([str(active)] if active else [])
                await _remove_chat(tx, chat_id, run_ids)
            await tx.execute("DELETE FROM projects WHERE user_id = ?", (user_id,))
            await delete_account(tx, user_id)
            return len(chats)

        return await self._store.write(remove)
