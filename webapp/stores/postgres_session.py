"""PostgresSession: the Session log in one PostgreSQL table, one row per finished run.

The table is the SQLite store's (``session_segments``, with each run's place
in the flat transcript in ``first_entry``/``entry_count``) and so are the
costs: ``append`` reads only the last row, ``rewind`` only the rows ending
past the cut (an index on ``first_entry + entry_count``), ``load`` and
``segments`` are one ordered query.

Invariants, each named for the failure it prevents:
- one writer per session at a time: every write takes the session's
  transaction-level advisory lock first, so two processes appending to one
  session never compute the same position, and an append never builds on
  rows a concurrent rewind or clear is deleting. (Under READ COMMITTED the
  statement after the lock sees everything committed before it.)
- entries and meta are TEXT holding the JSON the SQLite store writes, not
  JSONB: JSONB rejects ``\\u0000`` (tool outputs may hold NULs) and reorders
  meta's keys, and TEXT moves between back ends and tables unchanged;
- an append is safe to run twice (idempotent per run_id), which is what lets
  `PostgresStore` retry it after a lost connection. A rewind or trim retried
  that way leaves the same rows but may count only what the second run did.

The rules of ``rewind`` and ``trim_tool_results`` live in
`webapp.stores.session` and are shared with the other stores.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from webapp.stores import segment_rows
from webapp.stores.codec import (
    SQL_INT_MAX,
    check_id,
    decode_all,
    decode_segments,
    encode_entries,
    encode_meta,
    trimmed_rows,
)
from webapp.stores.postgres import PostgresBacked
from webapp.stores.session import (
    Segment,
    check_non_negative,
    longest_untrimmed,
    new_run_id,
)
from webapp.stores.tx import PostgresTx, numbered
from webapp.transcript import Entry

# The rows a rewind can touch (`webapp.stores.segment_rows`), as PostgreSQL takes it.
TAIL_SQL = numbered(segment_rows.TAIL_SQL)

SCHEMA_NAME = "session"
SCHEMA_VERSION = 1
SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS session_segments (
    session_id   TEXT    NOT NULL,
    seq          BIGINT  NOT NULL,
    run_id       TEXT    NOT NULL,
    first_entry  BIGINT  NOT NULL,
    entry_count  INTEGER NOT NULL,
    entries_json TEXT    NOT NULL,
    meta_json    TEXT,
    PRIMARY KEY (session_id, seq),
    UNIQUE (session_id, run_id)
);
CREATE INDEX IF NOT EXISTS session_segments_end
    ON session_segments (session_id, (first_entry + entry_count));
"""


async def lock_session(conn: asyncpg.Connection, session_id: str) -> None:
    """Take ``session_id``'s write lock until the end of the open transaction."""
    await segment_rows.lock_session(PostgresTx(conn), session_id)


_TRIM_ROWS = """
SELECT seq, run_id, entries_json FROM session_segments
WHERE session_id = $1
  AND seq <= (SELECT seq FROM session_segments WHERE session_id = $1
              ORDER BY seq DESC LIMIT 1 OFFSET $2::bigint)
  AND octet_length(entries_json) > $3::bigint
"""


class PostgresSession(PostgresBacked):
    """A durable Session in PostgreSQL; see `webapp.stores.session` for the contract.

    ``dsn`` is a ``postgresql://user:password@host:port/dbname`` URL. The pool
    opens on first use and the tables are created then; any number of
    processes may share the database.
    """

    SCHEMA_NAME = SCHEMA_NAME
    SCHEMA_VERSION = SCHEMA_VERSION
    SCHEMA_SQL = SCHEMA_SQL

    # --- the Session protocol ---------------------------------------------------

    async def segments(self, session_id: str) -> list[Segment]:
        rows = await self._store.fetch(numbered(segment_rows.SEGMENTS_SQL), session_id)
        return decode_segments(session_id, rows)

    async def load(self, session_id: str) -> list[Entry]:
        rows = await self._store.fetch(numbered(segment_rows.LOAD_SQL), session_id)
        return decode_all(session_id, rows)

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
        # Encoded before any connection is taken: bad input fails this call alone.
        params = segment_rows.append_params(
            check_id("session_id", session_id),
            check_id("run_id", run_id),
            len(items),
            encode_entries(items),
            encode_meta(meta),
        )

        async def add(conn: asyncpg.Connection) -> None:
            await segment_rows.append_rows(PostgresTx(conn), session_id, [params])

        await self._store.transaction(add)
        return run_id

    async def clear(self, session_id: str) -> None:
        await self._store.transaction(lambda conn: segment_rows.clear(PostgresTx(conn), session_id))

    # --- maintenance --------------------------------------------------------------

    async def rewind(self, session_id: str, *, keep_entries: int) -> int:
        """Cut the flat transcript to its first ``keep_entries`` entries; see SPEC §2."""
        check_non_negative(keep_entries=keep_entries)

        return await self._store.transaction(
            lambda conn: segment_rows.rewind(PostgresTx(conn), session_id, keep_entries)
        )

    async def trim_tool_results(
        self, session_id: str, *, keep_chars: int = 400, keep_runs: int = 1
    ) -> int:
        """Shorten tool outputs of every run before the last ``keep_runs``; see SPEC §2."""
        check_non_negative(keep_chars=keep_chars, keep_runs=keep_runs)

        async def trim(conn: asyncpg.Connection) -> int:
            await lock_session(conn, session_id)
            # As in SQLite: only the older runs long enough to hold an output to shorten.
            rows = await conn.fetch(
                _TRIM_ROWS,
                session_id,
                min(keep_runs, SQL_INT_MAX),
                min(longest_untrimmed(keep_chars), SQL_INT_MAX),
            )
            total, updates = trimmed_rows(session_id, rows, keep_chars)
            if updates:
                await conn.executemany(
                    "UPDATE session_segments SET entries_json = $1 "
                    "WHERE session_id = $2 AND seq = $3",
                    updates,
                )
            return total

        return await self._store.transaction(trim)
