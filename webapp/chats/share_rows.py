"""The share links' tables, and their removal with a chat or its owner's account.

Apart from `webapp.chats.shares` so the chat's delete (`webapp.chats.library`)
and an account's disable (`webapp.chats.users`) revoke links in their own
transactions without importing what imports them.
"""

from __future__ import annotations

from webapp.chats.db import Tx

SCHEMA = """
CREATE TABLE IF NOT EXISTS shares (
    token TEXT PRIMARY KEY,
    chat_id TEXT NOT NULL UNIQUE,
    title TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS share_segments (
    token TEXT NOT NULL,
    seq INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    entry_count INTEGER NOT NULL,
    entries_json TEXT NOT NULL,
    meta_json TEXT,
    PRIMARY KEY (token, seq)
);
"""
POSTGRES_SCHEMA = SCHEMA.replace(" REAL ", " DOUBLE PRECISION ")


async def forget_chat(tx: Tx, chat_id: str) -> None:
    """Revoke ``chat_id``'s link (the chat is going)."""
    rows = await tx.fetch("SELECT token FROM shares WHERE chat_id = ?", (chat_id,))
    for (token,) in rows:
        await remove_link(tx, str(token))


async def forget_owner(tx: Tx, user_id: str) -> None:
    """Revoke the links of every chat of ``user_id`` (the account is disabled or removed)."""
    rows = await tx.fetch(
        "SELECT s.token FROM shares s JOIN chats c ON c.id = s.chat_id WHERE c.user_id = ?",
        (user_id,),
    )
    for (token,) in rows:
        await remove_link(tx, str(token))


async def remove_link(tx: Tx, token: str) -> None:
    await tx.execute("DELETE FROM share_segments WHERE token = ?", (token,))
    await tx.execute("DELETE FROM shares WHERE token = ?", (token,))
