"""The session's rows as the chat layer moves them, in either dialect.

Versions move whole segments between the session (``session_segments``, the
shown path) and the archive (``chat_runs``) inside one `ChatStore`
transaction, so these work on that transaction (`webapp.chats.db.Tx`) with
segments exactly as stored (`StoredSegment`): never re-encoded. An append here
is the session store's own (`webapp.stores.segment_rows`): the same statement,
the same idempotence and the same write lock, so the two never pick the same
position.
"""

from __future__ import annotations

from collections.abc import Iterable

from webapp.chats.db import Tx
from webapp.stores.codec import StoredSegment
from webapp.stores.segment_rows import append_params, append_rows, lock_session


async def cut_segments(tx: Tx, session_id: str, from_run_id: str) -> list[StoredSegment]:
    """Remove segment ``from_run_id`` and every later one; returns them in order
    (none if the session has no such segment). A rewind to that segment's start."""
    await lock_session(tx, session_id)
    rows = await tx.fetch(
        "SELECT seq, run_id, entry_count, entries_json, meta_json FROM session_segments "
        "WHERE session_id = ? AND seq >= (SELECT seq FROM session_segments "
        "WHERE session_id = ? AND run_id = ?) ORDER BY seq",
        (session_id, session_id, from_run_id),
    )
    if rows:
        await tx.execute(
            "DELETE FROM session_segments WHERE session_id = ? AND seq >= ?",
            (session_id, rows[0][0]),
        )
    return [StoredSegment(str(r[1]), int(r[2]), str(r[3]), r[4]) for r in rows]


async def append_segments(tx: Tx, session_id: str, segments: Iterable[StoredSegment]) -> None:
    """Append stored segments at the end: the session store's own rule
    (`webapp.stores.segment_rows`)."""
    await append_rows(
        tx,
        session_id,
        (
            append_params(session_id, s.run_id, s.entry_count, s.entries_json, s.meta_json)
            for s in segments
        ),
    )


async def stored_segments(tx: Tx, session_id: str) -> list[StoredSegment]:
    rows = await tx.fetch(
        "SELECT run_id, entry_count, entries_json, meta_json FROM session_segments "
        "WHERE session_id = ? ORDER BY seq",
        (session_id,),
    )
    return [StoredSegment(str(r[0]), int(r[1]), str(r[2]), r[3]) for r in rows]


async def shown_segment(tx: Tx, session_id: str, run_id: str) -> tuple[StoredSegment, bool] | None:
    """Segment ``run_id`` and whether it is the session's last; None if there is none."""
    rows = list(
        await tx.fetch(
            "SELECT seq, entry_count, entries_json, meta_json FROM session_segments "
            "WHERE session_id = ? AND run_id = ?",
            (session_id, run_id),
        )
    )
    if not rows:
        return None
    seq, count, entries_json, meta_json = rows[0]
    later = await tx.fetch(
        "SELECT 1 FROM session_segments WHERE session_id = ? AND seq > ? LIMIT 1",
        (session_id, seq),
    )
    return StoredSegment(run_id, int(count), str(entries_json), meta_json), not list(later)
