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

import contextlib
import gc
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import aiosqlite

from webapp.stores.session import (
    Segment,
    check_non_negative,
    longest_untrimmed,
    new_run_id,
    plan_rewind,
    trim_output,
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
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_SQL_INT_MAX = 2**63 - 1


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
        return _decode_segments(session_id, rows)

    async def load(self, session_id: str) -> list[Entry]:
        rows = await self._store.fetchall(
            "SELECT seq, run_id, entries_json FROM session_segments "
            "WHERE session_id = ? ORDER BY seq",
            (session_id,),
        )
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
            if plan.delete:
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


def _trimmed_rows(
    session_id: str, rows: Iterable[Any], keep_chars: int
) -> tuple[int, list[tuple[str, str, int]]]:
    """How many outputs get shorter, and the new ``entries_json`` of each row that changes.

    Rows are read as plain JSON, not as entries: an entry kind or a key this
    release does not know (a newer one wrote it) is written back as it was,
    and a row where no output gets shorter is not written at all.
    """
    above = longest_untrimmed(keep_chars)
    trimmed, updates = 0, []
    with _no_collections():
        for seq, run_id, data in rows:
            try:
                items = _DECODER.decode(data)
            except ValueError as exc:
                raise _bad_row(session_id, seq, run_id, "entries_json", exc) from exc
            changed = False
            for index, item in enumerate(items if type(items) is list else ()):
                if type(item) is not dict or item.get("type") != "tool_result":
                    continue
                output = item.get("output")
                if type(output) is not str or len(output) <= above:
                    continue
                call_id = item.get("call_id")
                if type(call_id) is not str:
                    problem = ValueError(f"tool_result entry {index} has no string call_id")
                    raise _bad_row(session_id, seq, run_id, "entries_json", problem)
                shorter = trim_output(call_id, output, keep_chars)
                if shorter is not None:
                    item["output"] = shorter
                    changed = True
                    trimmed += 1
            if changed:
                updates.append((_COMPACT(items), session_id, seq))
    return trimmed, updates


# --- whole segments, as stored ----------------------------------------------------
#
# The chat app keeps every version of a reply: what a rewind takes off the
# session is archived, and switching versions puts archived segments back, in
# one transaction of its own (webapp.chats.session_rows), in either dialect.


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


# --- encoding -----------------------------------------------------------------------


def _check_id(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _encode_entries(entries: Iterable[Entry]) -> str:
    return json.dumps([_entry_dict(e) for e in entries], ensure_ascii=False)


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
        items = _parse(data)
        if not isinstance(items, list):
            raise TypeError(f"expected a JSON list, got {type(items).__name__}")
        return _entries_from(items)
    except (ValueError, TypeError, AttributeError) as exc:
        raise _bad_row(session_id, seq, run_id, "entries_json", exc) from exc


_DECODER = json.JSONDecoder()  # what json.loads uses, called without its per-call wrapping


def _decode_all(session_id: str, rows: list[Any]) -> list[Entry]:
    """Every entry of ``rows`` (seq, run_id, entries_json), in order.

    All rows are parsed as one JSON array and built in one pass: per row, the
    calls cost as much as the parsing. Anything unexpected (a row that is not
    exactly one list, an entry that does not build) goes again row by row,
    which names the bad row in its error.
    """
    if not rows:
        return []
    try:
        with _no_collections():
            text = "[" + ",".join([r[2] for r in rows]) + "]"
            lists, end = _DECODER.raw_decode(text)
            if end == len(text) and len(lists) == len(rows) and all(type(x) is list for x in lists):
                return _entries_from([item for items in lists for item in items])
    except (ValueError, TypeError, AttributeError, KeyError):
        pass
    out: list[Entry] = []
    for seq, run_id, entries_json in rows:
        out.extend(_decode_entries(session_id, seq, run_id, entries_json))
    return out


def _decode_segments(session_id: str, rows: list[Any]) -> list[Segment]:
    """The segments of ``rows`` (seq, run_id, entries_json, meta_json), in order."""
    with _no_collections():
        return [_segment(session_id, *row) for row in rows]


@contextlib.contextmanager
def _no_collections() -> Iterator[None]:
    """The cyclic garbage collector paused while a load builds its containers.

    None of them can be garbage yet, but every few hundred of them start a
    collection that walks them all again: a quarter of a 10,000-run load.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _parse(data: str) -> Any:
    """``json.loads(data)``; a third faster for a text that is nothing but the value."""
    try:
        value, end = _DECODER.raw_decode(data)
    except (ValueError, TypeError):
        end = -1
    # Anything else (whitespace around the value, bytes, an error) as json.loads has it.
    return value if end == len(data) else json.loads(data)


# `entry_to_dict` and `entry_from_dict` are the reference, but they work out
# each class's fields again for every entry (`asdict`, `dataclasses.fields`):
# that was most of what a long `load` cost. The first entry of each kind goes
# through them and records its shape; later entries of exactly that shape (the
# keys `entry_to_dict` writes, in its order) are built directly, and anything
# else still takes the reference path.

_CLASSES: dict[str, tuple[type[Entry], tuple[str, ...]]] = {}  # "type" -> class, its keys
_NAMES: dict[type, str] = {}  # class -> "type", for classes whose __dict__ is their fields


def _entries_from(items: list[Any]) -> list[Entry]:
    """``[entry_from_dict(item) for item in items]``, built in ``items`` from its own dicts."""
    for index, item in enumerate(items):
        try:
            cls, keys = _CLASSES[item["type"]]
        except (KeyError, TypeError):  # not a dict, or a kind not seen yet: the reference decides
            cls, keys = None, None
        if cls is not None and tuple(item) == keys:
            # The dict, less "type", is exactly what the class's __init__ would
            # store; adopting it takes half the time of calling the class.
            del item["type"]
            built = object.__new__(cls)
            object.__setattr__(built, "__dict__", item)
            items[index] = built
            continue
        entry = entry_from_dict(item)
        kind = item["type"]
        if kind not in _CLASSES and _plain(entry):
            _CLASSES[kind] = (type(entry), ("type", *vars(entry)))
        items[index] = entry
    return items


def _plain(entry: Entry) -> bool:
    """True when ``entry``'s __dict__ holds its fields and nothing else sets them up."""
    names = [f.name for f in fields(entry)]
    own = getattr(entry, "__dict__", None)
    return own is not None and list(own) == names and not hasattr(type(entry), "__post_init__")


def _entry_dict(entry: Entry) -> dict[str, Any]:
    """Like `entry_to_dict` (a TypeError for anything but an entry)."""
    name = _NAMES.get(type(entry))
    if name is not None:
        return {"type": name, **entry.__dict__}
    data = entry_to_dict(entry)
    own = getattr(entry, "__dict__", None)
    if own is not None and list(data) == ["type", *own]:
        _NAMES[type(entry)] = data["type"]
    return data


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
