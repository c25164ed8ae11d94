"""Session: what a conversation has said so far, as an append-only log of runs.

Invariants, each named for the failure it prevents:
- append-only, no ``replace``: stored runs are immutable, so a resumed run can
  reload history safely and per-run ``meta`` always matches its entries;
- idempotent per (session_id, run_id): re-appending a stored run changes
  nothing, so a replay after a crash never writes a turn twice;
- copies out: callers mutating returned lists never change the store.

`rewind` and `trim_tool_results` are maintenance on the built-in stores, not
part of the protocol. The planning helpers here are shared by both stores so
their rules are written once.
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from webapp.transcript import Entry, ToolResultEntry, drop_dangling_tool_calls


@dataclass(frozen=True)
class Segment:
    run_id: str
    entries: list[Entry]
    meta: dict[str, Any] | None = None


@runtime_checkable
class Session(Protocol):
    async def segments(self, session_id: str) -> list[Segment]: ...

    async def load(self, session_id: str) -> list[Entry]: ...

    async def append(
        self,
        session_id: str,
        entries: list[Entry],
        *,
        run_id: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> str: ...

    async def clear(self, session_id: str) -> None: ...


def new_run_id() -> str:
    return uuid.uuid4().hex


def check_non_negative(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


# --- rewind -----------------------------------------------------------------


@dataclass
class RewindPlan:
    """What a rewind does to the segments at or after the cut."""

    delete: list[str] = field(default_factory=list)  # run_ids removed entirely
    truncate: Segment | None = None  # the cut-into run, new entries, meta cleared
    removed: int = 0  # entries that leave the flat view


def plan_rewind(tail: Iterable[tuple[int, Segment]], keep_entries: int) -> RewindPlan:
    """Plan a rewind from ``(first_flat_index, segment)`` pairs in run order.

    Pairs may start anywhere before the cut; segments wholly before it are
    left alone, so a store only needs to read its tail.
    """
    check_non_negative(keep_entries=keep_entries)
    plan = RewindPlan()
    for start, seg in tail:
        end = start + len(seg.entries)
        # keep_entries=0 empties the session, even of runs with no entries.
        if end <= keep_entries and keep_entries > 0:
            continue
        if start >= keep_entries:
            plan.delete.append(seg.run_id)
            plan.removed += len(seg.entries)
            continue
        kept = drop_dangling_tool_calls(seg.entries[: keep_entries - start])
        plan.removed += len(seg.entries) - len(kept)
        if kept:
            plan.truncate = Segment(seg.run_id, kept, None)
        else:
            plan.delete.append(seg.run_id)
    return plan


# --- trim_tool_results --------------------------------------------------------

_MARKER = re.compile(
    r"\n\[trimmed: (?P<cut>\d+) of (?P<total>\d+) characters removed; "
    r'recall_tool_result\("[^"\n]*"\) restores the full output only if it was archived\]\Z'
)


def _marker(call_id: str, cut: int, total: int) -> str:
    return (
        f"\n[trimmed: {cut} of {total} characters removed; "
        f'recall_tool_result("{call_id}") restores the full output only if it was archived]'
    )


def longest_untrimmed(keep_chars: int) -> int:
    """`trim_output` leaves every output of at most this many characters alone.

    A trimmed output is a prefix of at most ``keep_chars`` plus a marker no
    shorter than the one below, and is only used when shorter than the
    original: a store may skip shorter outputs without reading them.
    """
    return keep_chars + len(_marker("", 0, 0))


def trim_output(call_id: str, output: str, keep_chars: int) -> str | None:
    """The trimmed output, or None when trimming would not make it shorter.

    An output trimmed before keeps its original total, so trimming again with
    the same ``keep_chars`` changes nothing (idempotent) and a smaller one
    still reports honest numbers.
    """
    total = len(output)
    prefix = output
    # A marker ends the output and holds no line break but its first character:
    # if there is one, it starts at the last line break (a one-character search,
    # several times quicker over a long output than looking for the marker's text).
    start = output.rfind("\n")
    found = _MARKER.match(output, start) if start >= 0 else None
    if found:
        prefix = output[: found.start()]
        total = int(found.group("total"))
        if len(prefix) <= keep_chars:
            return None
    kept = prefix[:keep_chars]
    trimmed = kept + _marker(call_id, total - len(kept), total)
    return trimmed if len(trimmed) < len(output) else None


def trim_entries(entries: list[Entry], keep_chars: int) -> tuple[list[Entry], int]:
    """Entries with long tool outputs trimmed, and how many were trimmed."""
    out: list[Entry] = []
    count = 0
    for entry in entries:
        if isinstance(entry, ToolResultEntry):
            trimmed = trim_output(entry.call_id, entry.output, keep_chars)
            if trimmed is not None:
                entry = replace(entry, output=trimmed)
                count += 1
        out.append(entry)
    return out, count


# --- the in-memory store ------------------------------------------------------


class InMemorySession:
    """A Session in a dict: for tests and throwaway chats; gone with the process."""

    def __init__(self) -> None:
        self._data: dict[str, list[Segment]] = {}

    async def segments(self, session_id: str) -> list[Segment]:
        return [_copy_segment(s) for s in self._data.get(session_id, [])]

    async def load(self, session_id: str) -> list[Entry]:
        return [e for s in self._data.get(session_id, []) for e in s.entries]

    async def append(
        self,
        session_id: str,
        entries: list[Entry],
        *,
        run_id: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> str:
        run_id = run_id or new_run_id()
        log = self._data.setdefault(session_id, [])
        if not any(s.run_id == run_id for s in log):
            log.append(_copy_segment(Segment(run_id, list(entries), meta)))
        return run_id

    async def clear(self, session_id: str) -> None:
        self._data.pop(session_id, None)

    async def rewind(self, session_id: str, *, keep_entries: int) -> int:
        log = self._data.get(session_id, [])
        pairs, start = [], 0
        for seg in log:
            pairs.append((start, seg))
            start += len(seg.entries)
        plan = plan_rewind(pairs, keep_entries)
        gone = set(plan.delete)
        new_log = []
        for seg in log:
            if seg.run_id in gone:
                continue
            if plan.truncate is not None and seg.run_id == plan.truncate.run_id:
                seg = plan.truncate
            new_log.append(seg)
        if new_log:
            self._data[session_id] = new_log
        else:
            self._data.pop(session_id, None)
        return plan.removed

    async def trim_tool_results(
        self, session_id: str, *, keep_chars: int = 400, keep_runs: int = 1
    ) -> int:
        check_non_negative(keep_chars=keep_chars, keep_runs=keep_runs)
        log = self._data.get(session_id, [])
        older = len(log) - keep_runs
        total = 0
        for i in range(max(older, 0)):
            entries, count = trim_entries(log[i].entries, keep_chars)
            if count:
                log[i] = replace(log[i], entries=entries)
                total += count
        return total


def _copy_segment(seg: Segment) -> Segment:
    return Segment(seg.run_id, list(seg.entries), copy.deepcopy(seg.meta))
