"""The session's rows: where a new segment goes, written once for every writer.

``session_segments`` holds one row per finished run, with the run's place in the
flat transcript (``first_entry``, ``entry_count``). Three writers add rows: the
SQLite and PostgreSQL session stores (`append`) and the chat layer when it moves
versions between the shown path and the archive (`webapp.chats.session_rows`).
All three use this module, so the rule cannot drift apart:

- a new row's position comes from the current last row (an index lookup, however
  long the session);
- re-appending a stored ``run_id`` does nothing (``UNIQUE (session_id, run_id)``):
  an append is safe to run twice, which is what lets a store retry it after a
  lost connection;
- one writer per session at a time: on PostgreSQL a write first takes the
  session's lock (`Tx.lock`), so two processes never compute the same position
  and an append never builds on rows a concurrent rewind or clear is deleting.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from webapp.stores.tx import Tx

LOCK_SPACE = "webapp.session"  # the session write lock's space (`Tx.lock`)

# ? session_id, ? run_id, ? session_id, ? entry_count, ? entries_json, ? meta_json,
# ? session_id (`append_params`). Runs as is on SQLite (where the store's group
# commit sends consecutive appends as one executemany) and, numbered, on PostgreSQL.
APPEND_SQL = """
INSERT INTO session_segments
    (session_id, seq, run_id, first_entry, entry_count, entries_json, meta_json)
SELECT ?, COALESCE(MAX(seq), 0) + 1, ?,
       COALESCE((SELECT first_entry + entry_count FROM session_segments
                 WHERE session_id = ? ORDER BY seq DESC LIMIT 1), 0),
       ?, ?, ?
FROM session_segments WHERE session_id = ?
ON CONFLICT (session_id, run_id) DO NOTHING
"""


def append_params(
    session_id: str, run_id: str, entry_count: int, entries_json: str, meta_json: str | None
) -> tuple[Any, ...]:
    """`APPEND_SQL`'s parameters for one segment, already encoded."""
    return (session_id, run_id, session_id, entry_count, entries_json, meta_json, session_id)


async def lock_session(tx: Tx, session_id: str) -> None:
    """Take ``session_id``'s write lock until the end of the transaction."""
    await tx.lock(LOCK_SPACE, session_id)


async def append_rows(tx: Tx, session_id: str, rows: Iterable[tuple[Any, ...]]) -> None:
    """Append segments (each `append_params`) at the end of the session, in order,
    under its write lock."""
    batch = list(rows)
    if not batch:
        return
    await lock_session(tx, session_id)
    for params in batch:  # one at a time: each position follows the row before it
        await tx.execute(APPEND_SQL, params)
