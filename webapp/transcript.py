"""Transcript entries: the immutable records every store and model speaks.

Invariant: a transcript that is sent to a model, stored as a finished segment
or left behind by a rewind is *tool-consistent* -- every ToolCallEntry has a
ToolResultEntry with the same call_id. A dangling call makes OpenAI-style
endpoints reject the next request ("tool_calls must be followed by tool
messages"), which is how a stopped run used to break the following message.
`drop_dangling_tool_calls` is the one way to restore the invariant.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, Union


@dataclass(frozen=True)
class Attachment:
    """A file that came with a user message (SPEC §14); its bytes live in the chat database.

    ``id`` is the content hash the bytes are stored under; ``context`` says how a
    document's text goes to the model ("whole" or "excerpts"; "" for an image).
    """

    id: str
    name: str
    media_type: str
    size: int
    context: str = ""

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Attachment:
        known = {f.name for f in fields(Attachment)}
        return Attachment(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class UserEntry:
    text: str
    # What came with the message, recorded so that every attempt of its run (a
    # resume after a crash, a regenerate) sends the model the same. Stored only
    # when there are some.
    attachments: tuple[Attachment, ...] = ()


@dataclass(frozen=True)
class AssistantEntry:
    text: str


@dataclass(frozen=True)
class ReasoningEntry:
    text: str


@dataclass(frozen=True)
class ToolCallEntry:
    call_id: str
    name: str
    arguments: str  # JSON text exactly as the model sent it


@dataclass(frozen=True)
class ToolResultEntry:
    call_id: str
    output: str  # what the model reads
    is_error: bool = False
    # Images the tool returned, as data: URLs, for the user to see (the model reads
    # a placeholder in ``output``). Stored only when there are some.
    images: tuple[str, ...] = ()


Entry = Union[UserEntry, AssistantEntry, ReasoningEntry, ToolCallEntry, ToolResultEntry]

_TYPES: dict[str, type] = {
    "user": UserEntry,
    "assistant": AssistantEntry,
    "reasoning": ReasoningEntry,
    "tool_call": ToolCallEntry,
    "tool_result": ToolResultEntry,
}
_NAMES: dict[type, str] = {cls: name for name, cls in _TYPES.items()}
ENTRY_TYPES: tuple[type, ...] = tuple(_TYPES.values())  # for isinstance checks


def entry_to_dict(entry: Entry) -> dict[str, Any]:
    """A JSON-safe dict with a ``"type"`` key naming the entry kind."""
    try:
        name = _NAMES[type(entry)]
    except KeyError:
        raise TypeError(f"not a transcript entry: {entry!r}") from None
    return omit_empty({"type": name, **asdict(entry)})


# Fields added after the first format, written only when they hold something: absent
# means empty, so older readers and exports stay as they were.
OMITTED_WHEN_EMPTY = ("images", "attachments")


def omit_empty(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the later fields that are empty (see `OMITTED_WHEN_EMPTY`)."""
    for key in OMITTED_WHEN_EMPTY:
        if key in data and not data[key]:
            del data[key]
    return data


def entry_from_dict(data: dict[str, Any]) -> Entry:
    """Rebuild an entry; unknown keys are ignored, an unknown type raises."""
    kind = data.get("type")
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(
            f"unknown transcript entry type {kind!r}; expected one of {sorted(_TYPES)}"
        )
    known = {f.name for f in fields(cls)}
    values = {k: v for k, v in data.items() if k in known}
    if isinstance(values.get("images"), list):  # JSON has no tuples
        values["images"] = tuple(values["images"])
    if isinstance(values.get("attachments"), (list, tuple)):
        try:
            values["attachments"] = tuple(
                a if isinstance(a, Attachment) else Attachment.from_dict(a)
                for a in values["attachments"]
            )
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"malformed attachments in {data!r}: {exc}") from None
    try:
        return cls(**values)  # type: ignore[no-any-return]
    except TypeError as exc:
        raise ValueError(f"malformed {kind} entry {data!r}: {exc}") from None


def drop_dangling_tool_calls(entries: Iterable[Entry]) -> list[Entry]:
    """Remove every ToolCallEntry without a matching result; keep the rest in order."""
    items = list(entries)
    answered = {e.call_id for e in items if isinstance(e, ToolResultEntry)}
    return [e for e in items if not (isinstance(e, ToolCallEntry) and e.call_id not in answered)]


def dangling_tool_calls(entries: Iterable[Entry]) -> list[ToolCallEntry]:
    """The calls that still wait for a result, in order."""
    items = list(entries)
    answered = {e.call_id for e in items if isinstance(e, ToolResultEntry)}
    return [e for e in items if isinstance(e, ToolCallEntry) and e.call_id not in answered]
