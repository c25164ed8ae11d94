"""SQLiteSession: the Session log in one SQLite table, one row per finished run.

Each row records where its run sits in the flat transcript (``first_entry``,
``entry_count``), which is what keeps the costly operations proportional to
what they change rather than to the session's length:
- ``append`` finds its position from the last row alone (index lookups);
- ``rewind`` reads only rows whose end lies past the cut, through an index on
  ``first_entry + entry_count``;
- ``load`` and ``segments`` are one ordered query;
- ``trim_tool_results`` reads only the rows long enough to hold an output it
  may shorten, and rewrites only those where one actually gets shorter: a row
  left as it was costs no page write and no search-index update.

The rules of ``rewind`` and ``trim_tool_results`` live in
`webapp.stores.session` and are shared with `InMemorySession`.
"""

from __future__ import annotations

from typing import Any

import aiosqlite

from webapp.stores import segment_rows

# The row encoding is shared with PostgreSQL (webapp.stores.codec); the names the
# SQL code below has always called stay, so that code reads as it did.
from webapp.stores.codec import SQL_INT_MAX as _SQL_INT_MAX
from webapp.stores.codec import check_id as _check_id
from webapp.stores.codec import decode_all as _decode_all
from webapp.stores.codec import decode_segments as _decode_segments
from webapp.stores.codec import encode_entries as _encode_entries
from webapp.stores.codec import encode_meta as _encode_meta
from webapp.stores.codec import trimmed_rows as _trimmed_rows
from webapp.stores.segment_rows import APPEND_SQL, append_params
from webapp.stores.session import (
    Segment,
    check_non_negative,
    longest_untrimmed,
    new_run_id,
)
from webapp.stores.sqlite import SQLiteBacked
from webapp.stores.tx import SQLiteTx
from webapp.transcript import Entry

# The rows a rewind can touch (`webapp.stores.segment_rows`, read through its index).
TAIL_SQL = segment_rows.TAIL_SQL

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

# The rows a trim may shorten: the runs before the last :keep_runs whose JSON
# is longer than any output `trim_output` leaves alone (in bytes, never fewer
# than characters). Python reads them as plain JSON and decides.
_TRIM_ROWS = """
SELECT seq, run_id, entries_json FROM session_segments
WHERE session_id = :sid
  AND seq <= (SELECT seq FROM session_segments WHERE session_id = :sid
              ORDER BY seq DESC LIMIT 1 OFFSET :keep_runs)
  AND length(CAST(entries_json AS BLOB)) > :above
"""
_TRIM_WRITE = "UPDATE session_segments SET entries_json = ? WHERE session_id = ? AND seq = ?"


class SQLiteSession(SQLiteBacked):
    """A durable Session in a SQLite file; see `webapp.stores.session` for the contract."""

    SCHEMA_NAME = SCHEMA_NAME
    SCHEMA_VERSION = SCHEMA_VERSION
    SCHEMA_SQL = SCHEMA_SQL

    # --- the Session protocol ---------------------------------------------------

    async def segments(self, session_id: str) -> list[Segment]:
        rows = await self._store.fetchall(segment_rows.SEGMENTS_SQL, (session_id,))
        return _decode_segments(session_id, rows)

    async def load(self, session_id: str) -> list[Entry]:
        rows = await self._store.fetchall(segment_rows.LOAD_SQL, (session_id,))
        return _decode_all(session_id, rows)

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
        params = append_params(
            _check_id("session_id", session_id),
            _check_id("run_id", run_id),
            len(items),
            _encode_entries(items),
            _encode_meta(meta),
        )
        # One statement: concurrent appends share one executemany per batch (SQLite has
        # one writer per file: the session's lock is nothing to take here).
        await self._store.execute(APPEND_SQL, params)
        return run_id

    async def clear(self, session_id: str) -> None:
        await self._store.write(lambda db: segment_rows.clear(SQLiteTx(db), session_id))

    # --- maintenance --------------------------------------------------------------

    async def rewind(self, session_id: str, *, keep_entries: int) -> int:
        """Cut the flat transcript to its first ``keep_entries`` entries; see SPEC §2."""
        check_non_negative(keep_entries=keep_entries)

        return await self._store.write(
            lambda db: segment_rows.rewind(SQLiteTx(db), session_id, keep_entries)
        )

    async def trim_tool_results(
        self, session_id: str, *, keep_chars: int = 400, keep_runs: int = 1
    ) -> int:
        """Shorten tool outputs of every run before the last ``keep_runs``; see SPEC §2.

        Maintenance, not validation: Python decodes only the entries SQLite
        finds long enough to shorten, so a run holding an entry kind this
        release does not know is passed over, not refused (`load` and
        `segments` still report it).
        """
        check_non_negative(keep_chars=keep_chars, keep_runs=keep_runs)
        # Values past SQLite's integers select nothing, exactly like the largest one.
        params = {
            "sid": session_id,
            "keep_runs": min(keep_runs, _SQL_INT_MAX),
            "above": min(longest_untrimmed(keep_chars), _SQL_INT_MAX),
        }

        async def trim(db: aiosqlite.Connection) -> int:
            rows = await db.execute_fetchall(_TRIM_ROWS, params)
            trimmed, updates = _trimmed_rows(session_id, rows, keep_chars)
            if not updates:
                return trimmed
            # A row's long output leaves for free pages. With secure_delete on (Debian
            # builds SQLite so), each freed page is first journaled, then zeroed: the
            # writes of the update itself, twice over. A trim shortens what the model is
            # sent, it deletes nothing a user asked to delete: FAST zeroes only where
            # no page write is added. The connection's own setting is back after.
            [(before,)] = await db.execute_fetchall("PRAGMA secure_delete")
            await db.execute("PRAGMA secure_delete = FAST")
            try:
                await db.executemany(_TRIM_WRITE, updates)
            finally:
                await db.execute(f"PRAGMA secure_delete = {int(before)}")
            return trimmed

        return await self._store.write(trim)
