"""SQLiteCheckpointer: run snapshots as a replaced head plus append-only entry rows.

A save inserts only the entries produced since the previous save, at the
positions after the ones stored (``checkpoint_entries`` keyed by
``(run_id, idx)``), and replaces the one ``checkpoint_heads`` row. So one save
costs what it adds, never the run's length, and a saved entry is never
rewritten. A checkpoint append is not idempotent -- calling it twice stores
the entries twice -- which is why the store retries only failures that
provably never committed.
"""

from __future__ import annotations

import json
from typing import Any

import aiosqlite

from webapp.stores import checkpoint_rows, streamed
from webapp.stores.checkpoint import RunHead, RunSnapshot
from webapp.stores.checkpoint_rows import SQLITE_SAVE_ENTRIES, SQLITE_SAVE_HEAD

# The row decoding is shared with PostgreSQL (webapp.stores.codec).
from webapp.stores.codec import decode_checkpoint_entries as _decode_entries
from webapp.stores.codec import decode_head as _decode_head
from webapp.stores.sqlite import SQLiteBacked
from webapp.stores.streamed import StreamedPiece, StreamedTurn
from webapp.stores.tx import SQLiteTx
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
    entry_count INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoint_entries (
    run_id     TEXT    NOT NULL,
    idx        INTEGER NOT NULL,
    entry_json TEXT    NOT NULL,
    PRIMARY KEY (run_id, idx)
);
"""
)


_HAS_HEAD = "SELECT 1 FROM checkpoint_heads WHERE run_id = ?"


class SQLiteCheckpointer(SQLiteBacked):
    """A durable Checkpointer in a SQLite file; see `webapp.stores.checkpoint`."""

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
        # Encoded here, in the caller's task: bad input fails this call alone.
        rows = [
            (run_id, i, json.dumps(entry_to_dict(e), ensure_ascii=False))
            for i, e in enumerate(entries)
        ]
        try:
            head_json = json.dumps(head.to_dict(), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"RunHead for run {run_id!r} is not JSON-serializable "
                f"(check context_state and output): {exc}"
            ) from None

        async def save(db: aiosqlite.Connection) -> None:
            if rows:
                await db.executemany(SQLITE_SAVE_ENTRIES, rows)
            await db.execute(SQLITE_SAVE_HEAD, (run_id, head_json, len(rows)))

        await self._store.write(save)

    async def load(self, run_id: str) -> RunSnapshot | None:
        # Most loads are a new run's check that it has none: one statement says so with
        # no transaction around it; a run that has one is read whole in one.
        if not await self._store.fetchall(_HAS_HEAD, (run_id,)):
            return None

        async def query(db: aiosqlite.Connection) -> tuple[Any, list[Any]] | None:
            heads = list(
                await db.execute_fetchall(
                    "SELECT head_json, entry_count FROM checkpoint_heads WHERE run_id = ?",
                    (run_id,),
                )
            )
            if not heads:
                return None
            entries = await db.execute_fetchall(
                "SELECT idx, entry_json FROM checkpoint_entries WHERE run_id = ? ORDER BY idx",
                (run_id,),
            )
            return heads[0], list(entries)

        found = await self._store.read(query)
        if found is None:
            return None
        (head_json, count), rows = found
        head = _decode_head(run_id, head_json)
        return RunSnapshot(run_id, _decode_entries(run_id, count, rows), head)

    async def delete(self, run_id: str) -> None:
        await self._store.write(lambda db: checkpoint_rows.delete(SQLiteTx(db), run_id))

    # --- the streamed text of the turn in flight (webapp.stores.streamed) ---------------

    async def save_streamed(self, run_id: str, piece: StreamedPiece) -> None:
        """Add ``piece`` (index 0 first deletes every earlier piece of the run).

        One-statement jobs: the pieces of the runs saving on the same tick
        (`webapp.runtime.streaming`) commit together as one ``executemany``.
        Should the delete commit and the insert not, the turn has no pieces and
        is redone, as if it had not been saved yet."""
        for sql, params in streamed.statements(run_id, piece):
            await self._store.execute(sql, params)

    async def load_streamed(self, run_id: str, turn: int) -> StreamedTurn | None:
        return await self._store.read(lambda db: streamed.load(SQLiteTx(db), run_id, turn))
