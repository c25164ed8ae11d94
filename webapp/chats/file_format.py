"""A chat as a file: JSON (the whole tree, every version) and Markdown (the shown path).

The JSON format (``format_version`` 1) holds the chat's title and times and
every finished run of its tree in creation order: its id, its parent (the run
before it on its path), the user-message version it answers (``message_id``),
its selection rank (the largest is shown), its entries (SPEC §1 dicts) and its
segment meta. Ids are keys ending in ``_id`` and times keys ending in ``_at``,
so two exports of the same chat differ in nothing else.

Import validates the whole file before anything is written and says where the
problem is (``runs[3].entries[0]: ...``); a valid file becomes a new chat with
fresh ids, in one transaction (`store_import`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, fields
from typing import Any

from webapp.stores.codec import StoredSegment
from webapp.transcript import (
    AssistantEntry,
    Entry,
    ReasoningEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
    entry_from_dict,
    entry_to_dict,
)
from webapp.chats.db import Tx
from webapp.chats.tree import Node, Tree, load_tree
from webapp.chats.session_rows import append_segments

FORMAT_VERSION = 1
MAX_FILE_BYTES = 10 * 1024 * 1024
MAX_TITLE_CHARS = 200
MAX_RUNS = 100_000


class ChatFileError(ValueError):
    """A chat file that cannot be imported; the message says what is wrong and where."""


@dataclass(frozen=True)
class ExportedRun:
    run_id: str
    parent_run_id: str | None
    message_id: str
    selected: int  # rank: the largest is shown
    entries: list[Entry]
    meta: dict[str, Any] | None


@dataclass(frozen=True)
class ChatFile:
    title: str
    created_at: float
    updated_at: float
    runs: list[ExportedRun]  # creation order


# --- reading a chat out of the store --------------------------------------------------


async def read_chat(tx: Tx, chat_id: str) -> ChatFile | None:
    """Everything an export needs, read in one transaction (finished runs only)."""
    rows = list(
        await tx.fetch("SELECT title, created_at, updated_at FROM chats WHERE id = ?", (chat_id,))
    )
    if not rows:
        return None
    title, created_at, updated_at = rows[0]
    stored: dict[str, tuple[str, str | None]] = {}
    for run_id, entries_json, meta_json in await tx.fetch(
        "SELECT run_id, entries_json, meta_json FROM session_segments WHERE session_id = ?",
        (chat_id,),
    ):
        stored[str(run_id)] = (str(entries_json), meta_json)
    for run_id, entries_json, meta_json in await tx.fetch(
        "SELECT run_id, entries_json, meta_json FROM chat_runs "
        "WHERE chat_id = ? AND entries_json IS NOT NULL",
        (chat_id,),
    ):
        stored[str(run_id)] = (str(entries_json), meta_json)
    tree = await load_tree(tx, chat_id)
    ranks = {
        n.run_id: i for i, n in enumerate(sorted(tree.nodes.values(), key=lambda n: n.selected), 1)
    }
    runs = []
    for node in sorted(tree.nodes.values(), key=lambda n: n.seq):
        if node.run_id not in stored:
            continue  # still running: not part of the chat yet
        entries_json, meta_json = stored[node.run_id]
        runs.append(
            ExportedRun(
                node.run_id,
                node.parent_run_id,
                node.message_id,
                ranks[node.run_id],
                [entry_from_dict(d) for d in json.loads(entries_json)],
                json.loads(meta_json) if meta_json is not None else None,
            )
        )
    return ChatFile(str(title), float(created_at), float(updated_at), runs)


def to_json(chat_id: str, chat: ChatFile) -> str:
    document = {
        "format_version": FORMAT_VERSION,
        "chat_id": chat_id,
        "exported_at": time.time(),
        "title": chat.title,
        "created_at": chat.created_at,
        "updated_at": chat.updated_at,
        "runs": [
            {
                "run_id": run.run_id,
                "parent_run_id": run.parent_run_id,
                "message_id": run.message_id,
                "selected": run.selected,
                "entries": [entry_to_dict(e) for e in run.entries],
                "meta": run.meta,
            }
            for run in chat.runs
        ],
    }
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


def to_markdown(chat: ChatFile) -> str:
    """The shown conversation, readable in any Markdown viewer."""
    tree = Tree(_nodes(chat.runs))
    by_id = {r.run_id: r for r in chat.runs}
    out = [f"# {_line(chat.title) or 'New chat'}", ""]
    for node in tree.path():
        run = by_id[node.run_id]
        status = (run.meta or {}).get("status")
        for entry in run.entries:
            out.extend(_markdown_entry(entry))
        if status == "stopped":
            out += ["*(Stopped)*", ""]
        elif status == "failed":
            out += [f"*(Failed: {_line(str((run.meta or {}).get('error', '')))})*", ""]
    return "\n".join(out).rstrip() + "\n"


def _markdown_entry(entry: Entry) -> list[str]:
    if isinstance(entry, UserEntry):
        return ["## You", "", entry.text, ""]
    if isinstance(entry, AssistantEntry):
        return ["## Assistant", "", entry.text, ""] if entry.text else []
    if isinstance(entry, ReasoningEntry):
        quoted = "\n".join("> " + line for line in entry.text.splitlines())
        return ["**Reasoning**", "", quoted, ""]
    if isinstance(entry, ToolCallEntry):
        return [f"**Tool call** `{entry.name}`", "", *_fenced(entry.arguments, "json"), ""]
    label = "Tool error" if entry.is_error else "Tool result"
    return [f"**{label}**", "", *_fenced(entry.output, ""), ""]


def _fenced(text: str, lang: str) -> list[str]:
    fence = "```"
    while fence in text:
        fence += "`"
    return [fence + lang, text, fence]


def _line(text: str) -> str:
    return " ".join(text.split())


def _nodes(runs: list[ExportedRun]) -> list[Node]:
    return [
        Node(r.run_id, r.parent_run_id, r.message_id, i, r.selected) for i, r in enumerate(runs)
    ]


# --- import ------------------------------------------------------------------------------


def parse(data: bytes) -> ChatFile:
    """Validate a chat file completely; `ChatFileError` says what is wrong."""
    if not data.strip():
        raise ChatFileError("The file is empty: choose a chat file exported as JSON.")
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ChatFileError(
            "The file is not text (UTF-8): choose a chat exported as JSON."
        ) from None
    except json.JSONDecodeError as exc:
        raise ChatFileError(
            f"The file is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
        ) from None
    if not isinstance(document, dict):
        raise ChatFileError("A chat file is a JSON object with format_version, title and runs.")
    version = document.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ChatFileError("format_version: missing or not a positive whole number.")
    if version > FORMAT_VERSION:
        raise ChatFileError(
            f"This chat file has format version {version}, newer than this app reads "
            f"({FORMAT_VERSION}). Update the app to import it."
        )
    title = _field(document, "title", str, "")
    if len(title) > MAX_TITLE_CHARS:
        raise ChatFileError(f"title: longer than {MAX_TITLE_CHARS} characters.")
    raw_runs = _field(document, "runs", list, "")
    if len(raw_runs) > MAX_RUNS:
        raise ChatFileError(f"runs: more than {MAX_RUNS:,} runs.")
    runs: list[ExportedRun] = []
    seen: dict[str, ExportedRun] = {}
    for index, raw in enumerate(raw_runs):
        run = _run(raw, f"runs[{index}]", seen)
        seen[run.run_id] = run
        runs.append(run)
    now = time.time()
    return ChatFile(
        " ".join(title.split()),
        _time(document.get("created_at"), now),
        _time(document.get("updated_at"), now),
        runs,
    )


def _run(raw: object, where: str, seen: dict[str, ExportedRun]) -> ExportedRun:
    if not isinstance(raw, dict):
        raise ChatFileError(f"{where}: not an object.")
    run_id = _field(raw, "run_id", str, where)
    if not run_id or run_id in seen:
        raise ChatFileError(f"{where}.run_id: empty, or the same as an earlier run's.")
    parent = raw.get("parent_run_id")
    if parent is not None and (not isinstance(parent, str) or parent not in seen):
        raise ChatFileError(f"{where}.parent_run_id: not the id of an earlier run.")
    message_id = _field(raw, "message_id", str, where)
    if message_id != run_id:
        first = seen.get(message_id)
        if first is None or first.parent_run_id != parent:
            raise ChatFileError(
                f"{where}.message_id: neither the run's own id nor an earlier version of the "
                "same message."
            )
    selected = raw.get("selected")
    if not isinstance(selected, int) or isinstance(selected, bool):
        raise ChatFileError(f"{where}.selected: not a whole number.")
    entries = [
        _entry(e, f"{where}.entries[{i}]")
        for i, e in enumerate(_field(raw, "entries", list, where))
    ]
    if not entries or not isinstance(entries[0], UserEntry):
        raise ChatFileError(f"{where}.entries: a run starts with the user's message.")
    meta = raw.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise ChatFileError(f"{where}.meta: not an object or null.")
    return ExportedRun(run_id, parent, message_id, selected, entries, meta)


_ENTRY_TYPES = {UserEntry, AssistantEntry, ReasoningEntry, ToolCallEntry, ToolResultEntry}


def _entry(raw: object, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise ChatFileError(f"{where}: not an object.")
    try:
        entry = entry_from_dict(raw)
    except ValueError as exc:
        raise ChatFileError(f"{where}: {exc}") from None
    if "images" in raw and not (
        isinstance(raw["images"], list)
        and all(isinstance(i, str) and i.startswith("data:image/") for i in raw["images"])
    ):
        raise ChatFileError(f"{where}.images: expected a list of data:image/ URLs.")
    for f in fields(entry):  # type: ignore[arg-type]
        if f.name == "images":
            continue
        value = getattr(entry, f.name)
        expected = bool if f.name == "is_error" else str
        if not isinstance(value, expected):
            raise ChatFileError(f"{where}.{f.name}: expected {expected.__name__}.")
    return entry


def _field(document: dict[str, Any], name: str, kind: type, where: str) -> Any:
    value = document.get(name)
    if not isinstance(value, kind):
        prefix = f"{where}." if where else ""
        raise ChatFileError(f"{prefix}{name}: missing or not a {kind.__name__}.")
    return value


def _time(value: object, default: float) -> float:
    return (
        float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
    )


async def store_import(tx: Tx, chat: ChatFile) -> str:
    """Write a validated chat file as a new chat (fresh ids); returns its id."""
    chat_id = uuid.uuid4().hex
    await tx.execute(
        "INSERT INTO chats (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
        (chat_id, chat.title, chat.created_at, time.time()),
    )
    new_ids = {run.run_id: uuid.uuid4().hex for run in chat.runs}
    tree = Tree(_nodes(chat.runs))
    shown = {n.run_id for n in tree.path()}
    for seq, run in enumerate(chat.runs, 1):
        stored = StoredSegment.encode(new_ids[run.run_id], run.entries, run.meta)
        archived = run.run_id not in shown
        await tx.execute(
            "INSERT INTO chat_runs (run_id, chat_id, parent_run_id, message_id, seq, selected, "
            "entry_count, entries_json, meta_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                stored.run_id,
                chat_id,
                new_ids[run.parent_run_id] if run.parent_run_id else None,
                new_ids[run.message_id],
                seq,
                run.selected,
                stored.entry_count if archived else None,
                stored.entries_json if archived else None,
                stored.meta_json if archived else None,
            ),
        )
    by_id = {r.run_id: r for r in chat.runs}
    await append_segments(
        tx,
        chat_id,
        [
            StoredSegment.encode(new_ids[n.run_id], by_id[n.run_id].entries, by_id[n.run_id].meta)
            for n in tree.path()
        ],
    )
    return chat_id
