"""SQLiteSession: the Session log in one SQLite table, one row per finished run.

Each row records where its run sits in the flat transcript (``first_entry``,
``entry_count``), which is what keeps the costly operations proportional to
what they change rather than to the session's length:
- ``append`` finds its position from the last row alone (index lookups);
- ``rewind`` reads only rows whose end lies past the cut, through an index on
  ``first_entry + entry_count``;
- ``load`` and ``segments`` are one ordered query.

The rules of ``rewind`` and ``trim_tool_results`` live in
`webapp.stores.session` and are shared with `InMemorySession`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiosqlite

from webapp.stores.session import (
    Segment,
    check_non_negative,
    new_run_id,
    plan_rewind,
    trim_entries,
)
from webapp.stores.sqlite import SQLiteBacked, StoredDataError
from webapp.transcript import Entry, entry_from_dict, entry_to_dict

SCHEMA_NAME = "session"
SCHEMA_VERSION = 1
SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS session_segments (
    session_id   TEXT    NOT NULL,
    seq          INTEGER NOT NULL,
    run_id       TEXT    NOT NULL,
    first_entry  INTEGER NOT NULL,
    entry_count  INTEGER NOT NULL,
    entries_json TEXT    NOT NULL,
    meta_json    TEXT,
    PRIMARY KEY (session_id, seq),
    UNIQUE (session_id, run_id)
);
CREATE INDEX IF NOT EXISTS session_segments_end
    ON session_segments (session_id, first_entry + entry_count);
"""

# The position of a new row comes from the current last row: two index
# lookups, however long the session. Re-appending a stored run_id hits the
# UNIQUE constraint and does nothing (idempotent append).
_APPEND = """
INSERT INTO session_segments
    (session_id, seq, run_id, first_entry, entry_count, entries_json, meta_json)
VALUES (
    :sid,
    COALESCE((SELECT seq FROM session_segments
              WHERE session_id = :sid ORDER BY seq DESC LIMIT 1), 0) + 1,
    :rid,
    COALESCE((SELECT first_entry + entry_count FROM session_segments
              WHERE session_id = :sid ORDER BY seq DESC LIMIT 1), 0),
    :count, :entries, :meta
)
ON CONFLICT (session_id, run_id) DO NOTHING
"""

# The rows a rewind can touch: those ending past the cut. The condition
# matches the expression index, so only the tail is read.
TAIL_SQL = """
SELECT seq, run_id, first_entry, entries_json FROM session_segments
WHERE session_id = ? AND first_entry + entry_count > ? ORDER BY seq
"""


class SQLiteSession(SQLiteBacked):
    """A durable Session in a SQLite file; see `webapp.stores.session` for the contract."""

    SCHEMA_NAME = SCHEMA_NAME
    SCHEMA_VERSION = SCHEMA_VERSION
    SCHEMA_SQL = SCHEMA_SQL

    # --- the Session protocol ---------------------------------------------------

    async def segments(self, session_id: str) -> list[Segment]:
        rows = await self._store.fetchall(
            "SELECT seq, run_id, entries_json, meta_json FROM session_segments "
            "WHERE session_id = ? ORDER BY seq",
            (session_id,),
        )
        return [_segment(session_id, *row) for row in rows]

    async def load(self, session_id: str) -> list[Entry]:
        rows = await self._store.fetchall(
            "SELECT seq, run_id, entries_json FROM session_segments "
            "WHERE session_id = ? ORDER BY seq",
            (session_id,),
        )
        out: list[Entry] = []
        for seq, run_id, entries_json in rows:
            out.extend(_decode_entries(session_id, seq, run_id, entries_json))
        return out

    async def append(
        self,
        session_id: str,
        entries: list[Entry],
        *,
        run_id: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> str:
        run_id = run_id or new_run_id()
        items = list(entries)
        # Encoded here, in the caller's task: bad input fails this call alone.
        params = {
            "sid": _check_id("session_id", session_id),
            "rid": _check_id("run_id", run_id),
            "count": len(items),
            "entries": _encode_entries(items),
            "meta": _encode_meta(meta),
        }
        # One statement: concurrent appends share one executemany per batch.
        await self._store.execute(_APPEND, params)
        return run_id

    async def clear(self, session_id: str) -> None:
        await self._store.execute(
            "DELETE FROM session_segments WHERE session_id = ?", (session_id,)
        )

    # --- maintenance --------------------------------------------------------------

    async def rewind(self, session_id: str, *, keep_entries: int) -> int:
        """Cut the flat transcript to its first ``keep_entries`` entries; see SPEC §2."""
        check_non_negative(keep_entries=keep_entries)

        async def cut(db: aiosqlite.Connection) -> int:
            # Only rows ending past the cut (the tail) are read. A cut at 0
            # also takes empty runs at the very start: 0 empties the session.
            rows = await db.execute_fetchall(
                TAIL_SQL, (session_id, keep_entries if keep_entries > 0 else -1)
            )
            tail = [
                (first, Segment(run_id, _decode_entries(session_id, seq, run_id, data)))
                for seq, run_id, first, data in rows
            ]
            plan = plan_rewind(tail, keep_entries)
            await db.executemany(
                "DELETE FROM session_segments WHERE session_id = ? AND run_id = ?",
                [(session_id, run_id) for run_id in plan.delete],
            )
            if plan.truncate is not None:
                await db.execute(
                    "UPDATE session_segments SET entries_json = ?, entry_count = ?, "
                    "meta_json = NULL WHERE session_id = ? AND run_id = ?",
                    (
                        _encode_entries(plan.truncate.entries),
                        len(plan.truncate.entries),
                        session_id,
                        plan.truncate.run_id,
                    ),
                )
            return plan.removed

        return await self._store.write(cut)

    async def trim_tool_results(
        self, session_id: str, *, keep_chars: int = 400, keep_runs: int = 1
    ) -> int:
        """Shorten tool outputs of every run before the last ``keep_runs``; see SPEC §2."""
        check_non_negative(keep_chars=keep_chars, keep_runs=keep_runs)

        async def trim(db: aiosqlite.Connection) -> int:
            rows = list(
                await db.execute_fetchall(
                    "SELECT seq, run_id, entries_json FROM session_segments "
                    "WHERE session_id = ? ORDER BY seq",
                    (session_id,),
                )
            )
            older = rows[: max(len(rows) - keep_runs, 0)]
            updates, total = [], 0
            for seq, run_id, data in older:
                entries, count = trim_entries(
                    _decode_entries(session_id, seq, run_id, data), keep_chars
                )
                if count:
                    updates.append((_encode_entries(entries), session_id, seq))
                    total += count
            await db.executemany(
                "UPDATE session_segments SET entries_json = ? WHERE session_id = ? AND seq = ?",
                updates,
            )
            return total

        return await self._store.write(trim)


# --- whole segments inside another store's transaction ------------------------------
#
# The chat app keeps every version of a reply: what a rewind takes off the
# session is archived, and switching versions puts archived segments back.
# The archive and the session must change in ONE transaction (a crash between
# the two would lose a version or show one twice), so these work on the
# connection of whichever store owns that transaction, on segments as stored.


@dataclass(frozen=True)
class StoredSegment:
    """A segment exactly as stored: moved between tables, never re-encoded."""

    run_id: str
    entry_count: int
    entries_json: str
    meta_json: str | None

    @staticmethod
    def encode(run_id: str, entries: list[Entry], meta: dict[str, Any] | None) -> StoredSegment:
        return StoredSegment(run_id, len(entries), _encode_entries(entries), _encode_meta(meta))

    def decode(self, session_id: str) -> Segment:
        return _segment(session_id, 0, self.run_id, self.entries_json, self.meta_json)


async def cut_segments(
    db: aiosqlite.Connection, session_id: str, from_run_id: str
) -> list[StoredSegment]:
    """Remove segment ``from_run_id`` and every later one; returns them in order
    (none if the session has no such segment). A rewind to that segment's start."""
    rows = list(
        await db.execute_fetchall(
            "SELECT seq, run_id, entry_count, entries_json, meta_json FROM session_segments "
            "WHERE session_id = ? AND seq >= (SELECT seq FROM session_segments "
            "WHERE session_id = ? AND run_id = ?) ORDER BY seq",
            (session_id, session_id, from_run_id),
        )
    )
    if rows:
        await db.execute(
            "DELETE FROM session_segments WHERE session_id = ? AND seq >= ?",
            (session_id, rows[0][0]),
        )
    return [StoredSegment(str(r[1]), int(r[2]), str(r[3]), r[4]) for r in rows]


async def append_segments(
    db: aiosqlite.Connection, session_id: str, segments: Iterable[StoredSegment]
) -> None:
    """Append stored segments at the end, as `SQLiteSession.append` would."""
    await db.executemany(
        _APPEND,
        [
            {
                "sid": session_id,
                "rid": s.run_id,
                "count": s.entry_count,
                "entries": s.entries_json,
                "meta": s.meta_json,
            }
            for s in segments
        ],
    )


async def stored_segments(db: aiosqlite.Connection, session_id: str) -> list[StoredSegment]:
    rows = await db.execute_fetchall(
        "SELECT run_id, entry_count, entries_json, meta_json FROM session_segments "
        "WHERE session_id = ? ORDER BY seq",
        (session_id,),
    )
    return [StoredSegment(str(r[0]), int(r[1]), str(r[2]), r[3]) for r in rows]


# --- encoding -----------------------------------------------------------------------


def _check_id(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _encode_entries(entries: Iterable[Entry]) -> str:
    return json.dumps([entry_to_dict(e) for e in entries], ensure_ascii=False)


def _encode_meta(meta: dict[str, Any] | None) -> str | None:
    if meta is None:
        return None
    try:
        return json.dumps(meta, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"segment meta must be JSON-serializable (dicts, lists, str, numbers, bools, "
            f"None): {exc}"
        ) from None


def _decode_entries(session_id: str, seq: int, run_id: str, data: str) -> list[Entry]:
    try:
        items = json.loads(data)
        if not isinstance(items, list):
            raise TypeError(f"expected a JSON list, got {type(items).__name__}")
        return [entry_from_dict(item) for item in items]
    except (ValueError, TypeError, AttributeError) as exc:
        raise _bad_row(session_id, seq, run_id, "entries_json", exc) from exc


def _segment(session_id: str, seq: int, run_id: str, data: str, meta_json: str | None) -> Segment:
    entries = _decode_entries(session_id, seq, run_id, data)
    meta = None
    if meta_json is not None:
        try:
            meta = json.loads(meta_json)
        except ValueError as exc:
            raise _bad_row(session_id, seq, run_id, "meta_json", exc) from exc
    return Segment(run_id, entries, meta)


def _bad_row(
    session_id: str, seq: int, run_id: str, column: str, exc: Exception
) -> StoredDataError:
    return StoredDataError(
        f"session_segments row (session_id={session_id!r}, seq={seq}, run_id={run_id!r}) "
        f"has an undecodable {column}: {exc}. The row was written by another program or "
        "a newer version; repair or delete it (rewind or clear the session) to go on."
    )
