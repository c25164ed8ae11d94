"""A page of a chat's shown path: the latest runs, or those before one, with their switchers.

A long chat is read a page at a time (SPEC §7's path can hold thousands of
runs): a page costs the same few indexed reads wherever it is in the chat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webapp.chats import tree as chat_tree
from webapp.chats.db import Tx
from webapp.chats.tree import Tree
from webapp.stores.codec import StoredSegment
from webapp.stores.session import Segment


@dataclass(frozen=True)
class Page:
    """One page of a chat's shown path, oldest first."""

    segments: list[Segment]
    earlier: bool  # there are runs before the first one here
    tree: Tree  # the part of the tree these runs' switchers need


async def read_page(
    tx: Tx, chat_id: str, before: str | None, limit: int, also: list[str]
) -> Page | None:
    """`ChatStore.page` in transaction ``tx``."""
    bound = ""
    params: list[Any] = [chat_id]
    if before is not None:
        found = list(
            await tx.fetch(
                "SELECT seq FROM session_segments WHERE session_id = ? AND run_id = ?",
                (chat_id, before),
            )
        )
        if not found:
            return None
        bound, params = " AND seq < ?", [chat_id, found[0][0]]
    rows = list(
        await tx.fetch(
            "SELECT run_id, entry_count, entries_json, meta_json FROM session_segments "
            f"WHERE session_id = ?{bound} ORDER BY seq DESC LIMIT ?",
            (*params, limit + 1),
        )
    )
    earlier = len(rows) > limit
    stored = [StoredSegment(str(r[0]), int(r[1]), str(r[2]), r[3]) for r in rows[:limit]]
    segments = [s.decode(chat_id) for s in reversed(stored)]
    tree = await chat_tree.load_around(tx, chat_id, [s.run_id for s in segments] + also)
    return Page(segments, earlier, tree)
