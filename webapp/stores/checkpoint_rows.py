"""A checkpoint save's rows: the entries after the stored ones, and the head replaced.

Both checkpointers keep a run as one ``checkpoint_heads`` row (replaced on every
save, with the count of entries stored) and append-only ``checkpoint_entries``
rows keyed by ``(run_id, idx)``: a save inserts only what the run produced since
the last one, at the positions after those stored, so it costs what it adds and
never rewrites a saved entry. The statements are here, once (`delete` is the same
on both); a save differs by dialect only where the back ends' guarantees do:

- SQLite (`SQLITE_SAVE_ENTRIES`, then `SQLITE_SAVE_HEAD`, in one transaction of
  the store's single writer): the entries are numbered from the head's count as
  read in that transaction, then the head adds them to its count. A save is not
  idempotent, which is why the SQLite store retries only failures that provably
  never committed.
- PostgreSQL (`POSTGRES_SAVE`, one statement): the head is upserted first, locking
  its row, so concurrent saves of one run count from each other's result; each
  save carries a fresh ``save_id`` and one whose id the head already holds changes
  nothing, so a save retried after a lost connection stores nothing twice.
"""

from __future__ import annotations

from webapp.stores import streamed
from webapp.stores.tx import Tx

# ?1 run_id, ?2 the entry's index among this save's, ?3 entry_json (executemany).
SQLITE_SAVE_ENTRIES = """
INSERT INTO checkpoint_entries (run_id, idx, entry_json)
VALUES (?1, COALESCE((SELECT entry_count FROM checkpoint_heads WHERE run_id = ?1), 0) + ?2, ?3)
"""
# ?1 run_id, ?2 head_json, ?3 how many entries this save added.
SQLITE_SAVE_HEAD = """
INSERT INTO checkpoint_heads (run_id, head_json, entry_count) VALUES (?1, ?2, ?3)
ON CONFLICT (run_id) DO UPDATE SET
    head_json = excluded.head_json,
    entry_count = checkpoint_heads.entry_count + excluded.entry_count
"""

# $1 run_id, $2 head_json, $3 the new entries (text[]), $4 save_id. RETURNING gives
# the count after this save, from which the new entries' positions follow.
POSTGRES_SAVE = """
WITH head AS (
    INSERT INTO checkpoint_heads AS h (run_id, head_json, entry_count, save_id)
    VALUES ($1, $2, cardinality($3::text[]), $4)
    ON CONFLICT (run_id) DO UPDATE SET
        head_json = excluded.head_json,
        entry_count = h.entry_count + excluded.entry_count,
        save_id = excluded.save_id
    WHERE h.save_id <> excluded.save_id
    RETURNING h.entry_count
)
INSERT INTO checkpoint_entries (run_id, idx, entry_json)
SELECT $1, head.entry_count - cardinality($3::text[]) + new.ord::integer - 1, new.entry_json
FROM head, unnest($3::text[]) WITH ORDINALITY AS new (entry_json, ord)
"""


async def delete(tx: Tx, run_id: str) -> None:
    """Remove a run's checkpoint, on either back end. The head goes first: on PostgreSQL
    that takes the lock a concurrent save holds, so no entry outlives its head."""
    await tx.execute("DELETE FROM checkpoint_heads WHERE run_id = ?", (run_id,))
    await tx.execute("DELETE FROM checkpoint_entries WHERE run_id = ?", (run_id,))
    await streamed.clear(tx, run_id)  # the streamed text of its turn in flight goes with it
