"""The stores' rows as JSON text: entries, segment meta and run heads, both ways.

Written once for every back end: the SQLite and PostgreSQL tables hold the
same TEXT columns, so a row moves between back ends and tables unchanged, and
a row that cannot be decoded fails the same way on either, as
`StoredDataError` naming the row and the remedy -- never skipped silently.
Nothing here touches a connection.

Decoding is the hot path of a long session's ``load`` (see `decode_all`):
rows are parsed in one pass, and entries of a shape seen before are built
without going through `entry_from_dict` again.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any

from webapp.stores.checkpoint import RunHead
from webapp.stores.session import Segment, longest_untrimmed, trim_output
from webapp.transcript import Entry, entry_from_dict, entry_to_dict, omit_empty

__all__ = [
    "SQL_INT_MAX",
    "StoredDataError",
    "StoredSegment",
    "check_id",
    "decode_all",
    "decode_checkpoint_entries",
    "decode_entries",
    "decode_head",
    "decode_segments",
    "encode_entries",
    "encode_head",
    "encode_meta",
    "trimmed_rows",
]

SQL_INT_MAX = 2**63 - 1  # the largest integer either database takes
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class StoredDataError(ValueError):
    """A stored row cannot be decoded; raised instead of silently skipping it."""


# --- session rows -------------------------------------------------------------------


def trimmed_rows(
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
        return StoredSegment(run_id, len(entries), encode_entries(entries), encode_meta(meta))

    def decode(self, session_id: str) -> Segment:
        return _segment(session_id, 0, self.run_id, self.entries_json, self.meta_json)


# --- encoding -----------------------------------------------------------------------


def check_id(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def encode_entries(entries: Iterable[Entry]) -> str:
    return json.dumps([_entry_dict(e) for e in entries], ensure_ascii=False, default=_record)


def _record(value: object) -> dict[str, Any]:
    """A record inside an entry (a user message's attachments) as the dict `asdict` makes."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def encode_meta(meta: dict[str, Any] | None) -> str | None:
    if meta is None:
        return None
    try:
        return json.dumps(meta, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"segment meta must be JSON-serializable (dicts, lists, str, numbers, bools, "
            f"None): {exc}"
        ) from None


def decode_entries(session_id: str, seq: int, run_id: str, data: str) -> list[Entry]:
    try:
        items = _parse(data)
        if not isinstance(items, list):
            raise TypeError(f"expected a JSON list, got {type(items).__name__}")
        return _entries_from(items)
    except (ValueError, TypeError, AttributeError) as exc:
        raise _bad_row(session_id, seq, run_id, "entries_json", exc) from exc


_DECODER = json.JSONDecoder()  # what json.loads uses, called without its per-call wrapping


def decode_all(session_id: str, rows: list[Any]) -> list[Entry]:
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
        out.extend(decode_entries(session_id, seq, run_id, entries_json))
    return out


def decode_segments(session_id: str, rows: list[Any]) -> list[Segment]:
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

# A stored dict's kind and keys ("type" first) -> the class it builds and the fields it
# leaves to their defaults (a field added later, such as a tool result's ``images``, is
# written only when it holds something).
_CLASSES: dict[tuple[Any, tuple[str, ...]], tuple[type[Entry], dict[str, Any]]] = {}
_NAMES: dict[type, str] = {}  # class -> "type", for classes whose __dict__ is their fields


def _entries_from(items: list[Any]) -> list[Entry]:
    """``[entry_from_dict(item) for item in items]``, built in ``items`` from its own dicts."""
    for index, item in enumerate(items):
        keys = tuple(item) if type(item) is dict and type(item.get("type")) is str else None
        known = _CLASSES.get((item["type"], keys)) if keys is not None else None
        if known is not None:
            # The dict, less "type", plus the defaults is exactly what the class's
            # __init__ would store; adopting it takes half the time of calling it.
            cls, defaults = known
            del item["type"]
            if defaults:
                item.update(defaults)
            built = object.__new__(cls)
            object.__setattr__(built, "__dict__", item)
            items[index] = built
            continue
        entry = entry_from_dict(item)
        if keys is not None and keys[0] == "type":
            _learn(item["type"], keys, item, entry)
        items[index] = entry
    return items


def _learn(kind: str, keys: tuple[str, ...], item: dict[str, Any], entry: Entry) -> None:
    """Record ``keys`` as a shape to adopt when the reference built ``entry`` from ``item``
    with nothing but the stored values and immutable defaults."""
    if not _plain(entry):
        return
    own = vars(entry)
    stored = keys[1:]
    if any(name not in own or own[name] is not item[name] for name in stored):
        return  # the class changed a value on the way in (a list made a tuple, say)
    defaults = {name: value for name, value in own.items() if name not in stored}
    if all(isinstance(v, (tuple, str, bool, int, float, type(None))) for v in defaults.values()):
        _CLASSES[(kind, keys)] = (type(entry), defaults)


def _plain(entry: Entry) -> bool:
    """True when ``entry``'s __dict__ holds its fields and nothing else sets them up."""
    names = [f.name for f in fields(entry)]
    own = getattr(entry, "__dict__", None)
    return own is not None and list(own) == names and not hasattr(type(entry), "__post_init__")


def _entry_dict(entry: Entry) -> dict[str, Any]:
    """Like `entry_to_dict` (a TypeError for anything but an entry)."""
    name = _NAMES.get(type(entry))
    if name is not None:
        return omit_empty({"type": name, **entry.__dict__})
    data = entry_to_dict(entry)
    own = getattr(entry, "__dict__", None)
    # Fields left out when empty (`omit_empty`) are left out by the fast path too; a
    # record among the values (an attachment) is written by `_record` as `asdict` does.
    if own is not None and list(data) == [k for k in ("type", *own) if k in data]:
        _NAMES[type(entry)] = data["type"]
    return data


def _segment(session_id: str, seq: int, run_id: str, data: str, meta_json: str | None) -> Segment:
    entries = decode_entries(session_id, seq, run_id, data)
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


# --- checkpoint rows ----------------------------------------------------------------


def encode_head(run_id: str, head: RunHead) -> str:
    try:
        return json.dumps(head.to_dict(), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"RunHead for run {run_id!r} is not JSON-serializable "
            f"(check context_state and output): {exc}"
        ) from None


def decode_head(run_id: str, head_json: str) -> RunHead:
    try:
        data = json.loads(head_json)
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        return RunHead.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise StoredDataError(
            f"checkpoint_heads row for run {run_id!r} cannot be decoded: {exc}. Delete the "
            "checkpoint (it cannot be resumed) or repair the row."
        ) from exc


def decode_checkpoint_entries(run_id: str, count: int, rows: list[Any]) -> list[Entry]:
    if len(rows) != count or any(idx != i for i, (idx, _) in enumerate(rows)):
        raise StoredDataError(
            f"checkpoint of run {run_id!r} should hold entries 0..{count - 1} but holds "
            f"{[idx for idx, _ in rows][:20]}; it was changed outside this store. Delete the "
            "checkpoint (it cannot be resumed safely) or repair it."
        )
    out: list[Entry] = []
    for idx, data in rows:
        try:
            out.append(entry_from_dict(json.loads(data)))
        except (ValueError, TypeError, AttributeError) as exc:
            raise StoredDataError(
                f"checkpoint_entries row (run_id={run_id!r}, idx={idx}) cannot be decoded: "
                f"{exc}. Delete the checkpoint or repair the row."
            ) from exc
    return out
