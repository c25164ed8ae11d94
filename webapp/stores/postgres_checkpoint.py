"""PostgresCheckpointer: run snapshots as a replaced head plus append-only entry rows.

The tables are the SQLite store's: a save inserts only the entries produced
since the previous one, at the positions after those stored
(``checkpoint_entries`` keyed by ``(run_id, idx)``), and replaces the one
``checkpoint_heads`` row -- in ONE statement, so a save costs what it adds,
never the run's length, and a saved entry is never rewritten.

Invariants, each named for the failure it prevents:
- a save retried after a lost connection stores nothing twice: each call
  carries a fresh ``save_id``, recorded in the head, and a save whose id the
  head already holds changes nothing. (Whether a COMMIT whose reply was lost
  took effect cannot be known; without this a retry could store a turn twice.)
- concurrent saves of one run never take the same positions: the head row
  they both update is locked by the first until it commits, and the second
  then counts from the first's result;
- ``load`` reads the head and its entries in one statement, so it never sees
  a head without the entries saved with it;
- ``delete`` removes the head before the entries, taking the lock a
  concurrent save holds, so no entry outlives its head.
"""

from __future__ import annotations

import json
import uuid

from webapp.stores import checkpoint_rows, streamed
from webapp.stores.checkpoint import RunHead, RunSnapshot
from webapp.stores.checkpoint_rows import POSTGRES_SAVE
from webapp.stores.codec import decode_checkpoint_entries, decode_head, encode_head
from webapp.stores.postgres import PostgresBacked
from webapp.stores.streamed import StreamedPiece, StreamedTurn
from webapp.stores.tx import PostgresTx
from webapp.transcript import Entry, entry_to_dict

SCHEMA_NAME = "checkpoint"
SCHEMA_VERSION = 2
# 1 -> 2: the streamed text of a turn in flight (webapp.stores.streamed).
MIGRATIONS = {1: streamed.TABLE_SQL}
SCHEMA_SQL = (
    streamed.TABLE_SQL
    + """
CREATE TABLE IF NOT EXISTS checkpoint_heads (
    run_id      TEXT    PRIMARY KEY,
    head_json   TEXT    NOT NULL,
    entry_count INTEGER NOT NULL,
    save_id     TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoint_entries (
    run_id     TEXT    NOT NULL,
    idx        INTEGER NOT NULL,
    entry_json TEXT    NOT NULL,
    PRIMARY KEY (run_id, idx)
);
"""
)

SAVE_SQL = POSTGRES_SAVE  # the statement (`webapp.stores.checkpoint_rows`)

LOAD_SQL = """
SELECT h.head_json, h.entry_count,
    ARRAY(SELECT e.idx FROM checkpoint_entries e WHERE e.run_id = h.run_id ORDER BY e.idx),
    ARRAY(SELECT e.entry_json FROM checkpoint_entries e WHERE e.run_id = h.run_id ORDER BY e.idx)
FROM checkpoint_heads h WHERE h.run_id = $1
"""


class PostgresCheckpointer(PostgresBacked):
    """A durable Checkpointer in PostgreSQL; see `webapp.stores.checkpoint`.

    ``dsn`` is a ``postgresql://user:password@host:port/dbname`` URL. The pool
    opens on first use and the tables are created then.
    """

    SCHEMA_NAME = SCHEMA_NAME
    SCHEMA_VERSION = SCHEMA_VERSION
    SCHEMA_SQL = SCHEMA_SQL
    MIGRATIONS = MIGRATIONS

    async def append(self, run_id: str, entries: list[Entry], head: RunHead) -> None:
        """Add the entries produced since the last call and replace the head."""
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"run_id must be a non-empty string, got {run_id!r}")
        if not isinstance(head, RunHead):
            raise TypeError(f"head must be a RunHead, got {type(head).__name__}")
        # Encoded before any connection is taken: bad input fails this call alone.
        rows = [json.dumps(entry_to_dict(e), ensure_ascii=False) for e in entries]
        await self._save(run_id, rows, encode_head(run_id, head), uuid.uuid4().hex)

    async def _save(
        self, run_id: str, entries_json: list[str], head_json: str, save_id: str
    ) -> None:
        """`append` with its values encoded; a ``save_id`` already applied changes nothing."""
        await self._store.execute(SAVE_SQL, run_id, head_json, entries_json, save_id)

    async def load(self, run_id: str) -> RunSnapshot | None:
        rows = await self._store.fetch(LOAD_SQL, run_id)
        if not rows:
            return None
        head_json, count, positions, entries_json = rows[0]
        head = decode_head(run_id, head_json)
        stored = list(zip(positions, entries_json, strict=True))
        return RunSnapshot(run_id, decode_checkpoint_entries(run_id, count, stored), head)

    async def delete(self, run_id: str) -> None:
        await self._store.transaction(lambda conn: checkpoint_rows.delete(PostgresTx(conn), run_id))

    # --- the streamed text of the turn in flight (webapp.stores.streamed) ---------------

    async def save_streamed(self, run_id: str, piece: StreamedPiece) -> None:
        """Add ``piece`` (index 0 first deletes every earlier piece of the run)."""
        await self._store.transaction(lambda conn: streamed.save(PostgresTx(conn), run_id, piece))

    async def load_streamed(self, run_id: str, turn: int) -> StreamedTurn | None:
        return await self._store.transaction(
            lambda conn: streamed.load(PostgresTx(conn), run_id, turn)
        )
