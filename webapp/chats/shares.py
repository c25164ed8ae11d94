"""Read-only share links (SPEC §15): a snapshot of a chat's shown path behind a token.

A link is one row of ``shares`` (one per chat) and its snapshot the segments
of ``share_segments``: copies of the shown path's segments, exactly as stored,
taken when the link was created or last updated. Invariants, named for the
failure they prevent:
- the snapshot is a copy, not a pointer into the chat: a message sent, an
  edit or a switch after the link was made never leaks into the shared page
  before **Update link**;
- every lookup reads the database, and revoking deletes the rows: a revoked
  link is 404 at once on every process, with no cache to outlive it;
- deleting the chat (`forget_chat`, in the chat's own delete transaction) and
  disabling its owner (`forget_owner`, in the disable's) delete its link too,
  so a link never comes back when an account is enabled again;
- the token is 32 random bytes (256 bits) from `secrets`: it cannot be guessed.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from webapp.chats import attachments
from webapp.chats import settings as chat_settings
from webapp.chats import tree as chat_tree
from webapp.chats.db import ChatDatabase, Tx
from webapp.chats.library import Chat, owns
from webapp.chats.session_rows import append_segments, stored_segments
from webapp.chats.share_rows import POSTGRES_SCHEMA, SCHEMA, forget_chat, forget_owner
from webapp.chats.users import Owner
from webapp.stores.codec import StoredSegment
from webapp.stores.session import Segment
from webapp.transcript import UserEntry

SHARE_MODES = ("off", "signed-in", "anyone")
TOKEN_BYTES = 32  # 256 bits; the SPEC asks for at least 128
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{43}$")  # token_urlsafe(32): 43 characters


__all__ = [
    "POSTGRES_SCHEMA",
    "SCHEMA",
    "SHARE_MODES",
    "ShareLink",
    "SharedPage",
    "Shares",
    "forget_chat",
    "forget_owner",
]


@dataclass(frozen=True)
class ShareLink:
    """A chat's link as its owner sees it."""

    token: str
    chat_id: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class SharedPage:
    """One page of a snapshot: its title, runs oldest first, and the ``seq`` of the first
    one shown when older ones exist (the next page up)."""

    token: str
    title: str
    updated_at: float
    owner_id: str | None  # the chat's owner (None: an app without accounts)
    segments: list[Segment]
    earlier: int | None


def well_formed(token: str) -> bool:
    return bool(_TOKEN.match(token))


async def _snapshot(tx: Tx, token: str, chat_id: str) -> None:
    await tx.execute("DELETE FROM share_segments WHERE token = ?", (token,))
    await tx.executemany(
        "INSERT INTO share_segments (token, seq, run_id, entry_count, entries_json, meta_json) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [
            (token, seq, s.run_id, s.entry_count, s.entries_json, s.meta_json)
            for seq, s in enumerate(await stored_segments(tx, chat_id), 1)
        ],
    )


def _link(row: Sequence[Any]) -> ShareLink:
    return ShareLink(str(row[0]), str(row[1]), float(row[2]), float(row[3]))


class Shares:
    """The share links' reads and writes, on the chat database."""

    def __init__(self, db: ChatDatabase) -> None:
        self._db = db

    async def link(self, owner: Owner, chat_id: str) -> ShareLink | None:
        """``chat_id``'s link, if it has one and is ``owner``'s."""

        where, params = owner.condition("c.user_id")
        rows = await self._db.fetch(
            "SELECT s.token, s.chat_id, s.created_at, s.updated_at FROM shares s "
            f"JOIN chats c ON c.id = s.chat_id WHERE s.chat_id = ?{where}",
            (chat_id, *params),
        )
        return _link(rows[0]) if rows else None

    async def shared_chat_ids(self, owner: Owner) -> set[str]:
        """Which of ``owner``'s chats have a link (the chat list marks them)."""
        where, params = owner.condition("c.user_id")

        async def select(tx: Tx) -> set[str]:
            rows = await tx.fetch(
                f"SELECT s.chat_id FROM shares s JOIN chats c ON c.id = s.chat_id WHERE 1 = 1{where}",
                params,
            )
            return {str(r[0]) for r in rows}

        return await self._db.read(select)

    async def publish(self, owner: Owner, chat_id: str) -> ShareLink | None:
        """Create the chat's link, or update its snapshot to the shown path as it is now
        (the same token); None if the chat is not ``owner``'s."""
        now = time.time()

        async def write(tx: Tx) -> ShareLink | None:
            if not await owns(tx, owner, chat_id):
                return None
            chats = await tx.fetch("SELECT title FROM chats WHERE id = ?", (chat_id,))
            title = str(chats[0][0]) or "New chat"
            rows = await tx.fetch(
                "SELECT token, chat_id, created_at, updated_at FROM shares WHERE chat_id = ?",
                (chat_id,),
            )
            if rows:
                token, created = str(rows[0][0]), float(rows[0][2])
                await tx.execute(
                    "UPDATE shares SET title = ?, updated_at = ? WHERE token = ?",
                    (title, now, token),
                )
            else:
                token, created = secrets.token_urlsafe(TOKEN_BYTES), now
                await tx.execute(
                    "INSERT INTO shares (token, chat_id, title, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (token, chat_id, title, now, now),
                )
            await _snapshot(tx, token, chat_id)
            return ShareLink(token, chat_id, created, now)

        return await self._db.write(write)

    async def revoke(self, owner: Owner, chat_id: str) -> bool:
        """Delete the chat's link and snapshot; False if the chat is not ``owner``'s."""

        async def write(tx: Tx) -> bool:
            if not await owns(tx, owner, chat_id):
                return False
            await forget_chat(tx, chat_id)
            return True

        return await self._db.write(write)

    async def page(self, token: str, *, before: int | None, limit: int) -> SharedPage | None:
        """The snapshot's last ``limit`` runs before ``seq`` ``before`` (the end for None);
        None for an unknown, revoked or malformed token."""
        if not well_formed(token):
            return None

        async def select(tx: Tx) -> SharedPage | None:
            rows = await tx.fetch(
                "SELECT s.title, s.updated_at, c.user_id FROM shares s "
                "JOIN chats c ON c.id = s.chat_id WHERE s.token = ?",
                (token,),
            )
            if not rows:
                return None
            bound = before if before is not None else 2**31 - 1
            found = await tx.fetch(
                "SELECT seq, run_id, entry_count, entries_json, meta_json FROM share_segments "
                "WHERE token = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
                (token, bound, limit + 1),
            )
            more = len(found) > limit
            kept = list(reversed(found[:limit]))
            segments = [
                StoredSegment(str(r[1]), int(r[2]), str(r[3]), r[4]).decode(token) for r in kept
            ]
            earlier = int(kept[0][0]) if more and kept else None
            title, updated_at, owner_id = rows[0]
            return SharedPage(token, str(title), float(updated_at), owner_id, segments, earlier)

        return await self._db.read(select)

    async def continue_chat(self, owner: Owner, token: str, title: str) -> Chat | None:
        """A new chat of ``owner`` holding the snapshot (fresh run ids, as a branch);
        None for an unknown token."""
        if not well_formed(token):
            return None
        now = time.time()
        chat = Chat(uuid.uuid4().hex, title, now, now)

        async def copy(tx: Tx) -> Chat | None:
            if not await tx.fetch("SELECT 1 FROM shares WHERE token = ?", (token,)):
                return None
            await tx.execute(
                "INSERT INTO chats (id, title, created_at, updated_at, user_id) "
                "VALUES (?, ?, ?, ?, ?)",
                (chat.id, chat.title, now, now, owner.user_id),
            )
            rows = await tx.fetch(
                "SELECT run_id, entry_count, entries_json, meta_json FROM share_segments "
                "WHERE token = ? ORDER BY seq",
                (token,),
            )
            parent: str | None = None
            for number, row in enumerate(rows, 1):
                run_id = uuid.uuid4().hex
                await chat_tree.add_node(tx, chat.id, run_id, parent, run_id, (number, number))
                await chat_settings.copy_run(tx, str(row[0]), run_id)
                segment = StoredSegment(run_id, int(row[1]), str(row[2]), row[3])
                await append_segments(tx, chat.id, [segment])
                # The files its messages brought (§14) are the new chat's too: its own to
                # download, and kept while it holds them, whatever becomes of the original.
                brought = [
                    a
                    for e in segment.decode(chat.id).entries
                    if isinstance(e, UserEntry)
                    for a in e.attachments
                ]
                await attachments.link(tx, chat.id, brought)
                parent = run_id
            return chat

        return await self._db.write(copy)
