"""The session's rows: where a new segment goes, written once for every writer.

``session_segments`` holds one row per finished run, with the run's place in the
flat transcript (``first_entry``, ``entry_count``). Three writers add rows: the
SQLite and PostgreSQL session stores (`append`) and the chat layer when it moves
versions between the shown path and the archive (`webapp.chats.session_rows`).
All three use this module, so the rule cannot drift apart (and so do both stores'
reads, ``clear`` and ``rewind``):

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

from webapp.stores.codec import decode_entries, encode_entries
from webapp.stores.session import Segment, plan_rewind
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


# --- reading and cutting, the same on both back ends ----------------------------------

SEGMENTS_SQL = (
    "SELECT seq, run_id, entries_json, meta_json FROM session_segments "
    "WHERE session_id = ? ORDER BY seq"
)
LOAD_SQL = (
    "SELECT seq, run_id, entries_json FROM session_segments WHERE session_id = ? ORDER BY seq"
)

# The rows a rewind can touch: those ending past the cut. The condition matches the
# expression index on each row's end (``first_entry + entry_count``), so only the
# tail is read, however long the session.
TAIL_SQL = """
SELECT seq, run_id, first_entry, entries_json FROM session_segments
WHERE session_id = ? AND first_entry + entry_count > ? ORDER BY seq
"""
_DELETE_RUN = "DELETE FROM session_segments WHERE session_id = ? AND run_id = ?"
_TRUNCATE = (
    "UPDATE session_segments SET entries_json = ?, entry_count = ?, meta_json = NULL "
    "WHERE session_id = ? AND run_id = ?"
)


async def clear(tx: Tx, session_id: str) -> None:
    """Remove every segment of the session."""
    await lock_session(tx, session_id)
    await tx.execute("DELETE FROM session_segments WHERE session_id = ?", (session_id,))


async def rewind(tx: Tx, session_id: str, keep_entries: int) -> int:
    """Cut the flat transcript to its first ``keep_entries`` entries (SPEC §2, the rule
    in `webapp.stores.session.plan_rewind`); returns how many entries went."""
    await lock_session(tx, session_id)
    # Only rows ending past the cut (the tail) are read. A cut at 0 also takes empty
    # runs at the very start: 0 empties the session.
    rows = await tx.fetch(TAIL_SQL, (session_id, keep_entries if keep_entries > 0 else -1))
    tail = [
        (int(first), Segment(str(run_id), decode_entries(session_id, seq, run_id, data)))
        for seq, run_id, first, data in rows
    ]
    plan = plan_rewind(tail, keep_entries)
    await tx.executemany(_DELETE_RUN, [(session_id, run_id) for run_id in plan.delete])
    if plan.truncate is not None:
        entries = plan.truncate.entries
        await tx.execute(
            _TRUNCATE, (encode_entries(entries), len(entries), session_id, plan.truncate.run_id)
        )
    return plan.removed
