"""A chat as a file: JSON (the whole tree, every version) and Markdown (the shown path).

The JSON format (``format_version`` 1) holds the chat's title and times and
every finished run of its tree in creation order: its id, its parent (the run
before it on its path), the user-message version it answers (``message_id``),
its selection rank (the largest is shown), its entries (SPEC §1 dicts), its
segment meta, the model that wrote it (``model``, ``endpoint/model``) and the
tokens the endpoint reported (``usage``: ``input_tokens``, ``output_tokens``).
The last two are null when unknown, and absent from files of older versions,
which import as they always did. ``project`` (absent outside projects) names the
project the chat was in; import files it into the importer's project of that name. Ids are keys ending in ``_id`` and times keys ending in ``_at``,
so two exports of the same chat differ in nothing else.

Import validates the whole file before anything is written and says where the
problem is (``runs[3].entries[0]: ...``); a valid file becomes a new chat with
fresh ids, in one transaction (`store_import`).
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field, fields, replace
from typing import Any

from webapp.chats.db import Tx
from webapp.chats.file_export import (
    ExportedFile,
    FilesError,
    check_attachments,
    files_to_json,
    parse_files,
)
from webapp.chats.session_rows import append_segments
from webapp.chats.text import (
    MAX_MESSAGE_CHARS,
    MAX_TITLE_CHARS,
    clean_text,
    has_lone_surrogate,
    message_text,
    title_line,
)
from webapp.chats.tree import Node, Tree, load_tree
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
from webapp.usage import Usage, reported_count

FORMAT_VERSION = 1
MAX_FILE_BYTES = 10 * 1024 * 1024
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
    model: str | None = None  # endpoint/model
    usage: Usage | None = None  # None: the endpoint reported none


@dataclass(frozen=True)
class ChatFile:
    title: str
    created_at: float
    updated_at: float
    runs: list[ExportedRun]  # creation order
    files: list[ExportedFile] = field(default_factory=list)  # what they attached (§14)
    project: str | None = None  # the name of the project the chat was in


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
                node.model,
                node.usage,
            )
        )
    return ChatFile(str(title), float(created_at), float(updated_at), runs)


def to_json(chat_id: str, chat: ChatFile) -> str:
    document = {
        "format_version": FORMAT_VERSION,
        "chat_id": chat_id,
        "exported_at": time.time(),
        "title": chat.title,
        **({"project": chat.project} if chat.project else {}),
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
                "model": run.model,
                "usage": run.usage.to_dict() if run.usage is not None else None,
            }
            for run in chat.runs
        ],
    }
    if chat.files:
        document["files"] = files_to_json(chat.files)
    # Strict JSON: Infinity and NaN are not JSON, and no importer would take them back.
    return json.dumps(document, ensure_ascii=False, indent=2, allow_nan=False) + "\n"


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
        lines = ["## You", "", entry.text, ""]
        if entry.attachments:  # listed by name; the bytes are in the JSON export only
            lines += [f"*Attached: {_line(a.name)}*  " for a in entry.attachments] + [""]
        return lines
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

# The deepest a chat file nests objects and arrays anywhere in a run's meta (an
# export nests two or three): deeper would cost the exporter's recursion later.
MAX_NESTING = 32
# Times are seconds since 1970, up to the last second of the year 9999.
MAX_TIME = 253_402_300_799.0
# Every number the chat tables hold is a signed 64-bit integer (SQLite and PostgreSQL).
_INT_RANGE = range(-(2**63), 2**63)


class _OutOfRange:
    """A JSON integer no field can hold (beyond 64 bits): kept as a mark, so the
    field that meets it says so, instead of the parser failing without a place."""

    def __init__(self, digits: str) -> None:
        self.digits = digits


def _int(digits: str) -> int | _OutOfRange:
    # The length check first: int() of over 4,300 digits raises, and is slow before that.
    if len(digits) > 20:
        return _OutOfRange(digits)
    value = int(digits)
    return value if value in _INT_RANGE else _OutOfRange(digits)


# The decoder is C and keeps the interpreter for the whole file, so even from a worker
# thread it would stall the event loop's thread until the end; a Python call per
# object and per number is where the interpreter lets that thread run meanwhile.
def _passed(value: dict[str, Any]) -> dict[str, Any]:
    return value


def _float(digits: str) -> float:
    return float(digits)  # "1e400" is inf: the fields that take numbers refuse it


def parse(data: bytes, *, max_message_chars: int = MAX_MESSAGE_CHARS) -> ChatFile:
    """Validate a chat file completely; `ChatFileError` says what is wrong and where.

    The text in it meets the message form's rules (`webapp.chats.text`): control
    characters are taken out, a user message is at most ``max_message_chars``.
    Linear in the file's size, so it can run in a worker thread on any upload."""
    if not data.strip():
        raise ChatFileError("The file is empty: choose a chat file exported as JSON.")
    try:
        text = data.decode("utf-8")
        document = json.loads(text, parse_int=_int, parse_float=_float, object_hook=_passed)
    except UnicodeDecodeError:
        raise ChatFileError(
            "The file is not text (UTF-8): choose a chat exported as JSON."
        ) from None
    except json.JSONDecodeError as exc:
        raise ChatFileError(
            f"The file is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
        ) from None
    except RecursionError:
        raise ChatFileError(_too_deep(text)) from None
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
    title = title_line(_string(_field(document, "title", str, ""), "title"))
    if len(title) > MAX_TITLE_CHARS:
        raise ChatFileError(f"title: longer than {MAX_TITLE_CHARS} characters.")
    project = document.get("project") or ""  # optional: chats outside projects have none
    if not isinstance(project, str):
        raise ChatFileError("project: not a string.")
    if len(project) > MAX_TITLE_CHARS:
        raise ChatFileError(f"project: longer than {MAX_TITLE_CHARS} characters.")
    raw_runs = _field(document, "runs", list, "")
    if len(raw_runs) > MAX_RUNS:
        raise ChatFileError(f"runs: more than {MAX_RUNS:,} runs.")
    runs: list[ExportedRun] = []
    seen: dict[str, ExportedRun] = {}
    for index, raw in enumerate(raw_runs):
        run = _run(raw, f"runs[{index}]", seen, max_message_chars)
        seen[run.run_id] = run
        runs.append(run)
    now = time.time()
    try:
        files = parse_files(document, [e for run in runs for e in run.entries])
    except FilesError as exc:
        raise ChatFileError(str(exc)) from None
    return ChatFile(
        title,
        _time(document, "created_at", now),
        _time(document, "updated_at", now),
        _ranked(runs),
        files,
        " ".join(project.split()) or None,
    )


def _too_deep(text: str) -> str:
    """Where ``text`` first nests deeper than `MAX_NESTING` (the parser gave up deeper
    still, without saying where): brackets inside strings do not count."""
    depth = 0
    for token in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', text):
        if token.group() in "[{":
            depth += 1
            if depth > MAX_NESTING:
                at = token.start()
                line, column = text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
                return (
                    f"The file nests objects or arrays too deeply (line {line}, column "
                    f"{column}: more than {MAX_NESTING} levels); a chat file nests a few."
                )
        elif token.group() in "]}":
            depth -= 1
    return "The file nests objects or arrays too deeply; a chat file nests a few."


def _ranked(runs: list[ExportedRun]) -> list[ExportedRun]:
    """The runs with their selection stamps renumbered 1..n, in the same order.

    Only the order of the stamps means anything (the largest is shown), and a new
    version's stamp is the chat's largest plus one: a file's own numbers, up to
    2**63 - 1, would leave no room for it. Among equal stamps the earlier run ranks
    higher, as `Tree.chosen` picks the first of equals. An export already holds
    ranks 1..n, so a round trip keeps them."""
    order = sorted(range(len(runs)), key=lambda i: (runs[i].selected, -i))
    rank = {index: position for position, index in enumerate(order, 1)}
    return [replace(run, selected=rank[i]) for i, run in enumerate(runs)]


def _run(
    raw: object, where: str, seen: dict[str, ExportedRun], max_message_chars: int
) -> ExportedRun:
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
    if isinstance(selected, _OutOfRange):
        raise ChatFileError(f"{where}.selected: a number too large for a rank.")
    if not isinstance(selected, int) or isinstance(selected, bool):
        raise ChatFileError(f"{where}.selected: not a whole number.")
    entries = [
        _entry(e, f"{where}.entries[{i}]", max_message_chars)
        for i, e in enumerate(_field(raw, "entries", list, where))
    ]
    if not entries or not isinstance(entries[0], UserEntry):
        raise ChatFileError(f"{where}.entries: a run starts with the user's message.")
    meta = raw.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise ChatFileError(f"{where}.meta: not an object or null.")
    if meta is not None:
        meta = _meta_value(meta, f"{where}.meta", 1)
    model = raw.get("model")
    if model is not None and (not isinstance(model, str) or not 0 < len(model) <= 200):
        raise ChatFileError(f"{where}.model: not a model's name (endpoint/model) or null.")
    model = clean_text(_string(model, f"{where}.model")) if model is not None else None
    return ExportedRun(
        run_id, parent, message_id, selected, entries, meta, model, _usage(raw, where)
    )


def _usage(raw: dict[str, Any], where: str) -> Usage | None:
    usage = raw.get("usage")
    if usage is None:
        return None
    problem = ChatFileError(
        f"{where}.usage: neither null nor input_tokens and output_tokens (whole numbers from 0)."
    )
    if not isinstance(usage, dict):
        raise problem
    counts: list[int] = []
    for key in ("input_tokens", "output_tokens"):
        count = usage.get(key)
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise problem
        counts.append(count)
    if any(reported_count(c, f"{where}.usage") is None for c in counts):
        return None  # past 2^53: not a count any endpoint reports; the run keeps the rest
    return Usage(*counts)


_ENTRY_TYPES = {UserEntry, AssistantEntry, ReasoningEntry, ToolCallEntry, ToolResultEntry}


def _entry(raw: object, where: str, max_message_chars: int) -> Entry:
    if not isinstance(raw, dict):
        raise ChatFileError(f"{where}: not an object.")
    try:
        entry = entry_from_dict(raw)
    except ValueError as exc:
        reason = str(exc)  # it quotes the entry, which may be most of the file
        raise ChatFileError(f"{where}: {reason[:300]}{'…' if len(reason) > 300 else ''}") from None
    cleaned: dict[str, Any] = {}
    try:
        check_attachments(raw, where)
    except FilesError as exc:
        raise ChatFileError(str(exc)) from None
    if "images" in raw and not (
        isinstance(raw["images"], list)
        and all(isinstance(i, str) and i.startswith("data:image/") for i in raw["images"])
    ):
        raise ChatFileError(f"{where}.images: expected a list of data:image/ URLs.")
    for f in fields(entry):  # type: ignore[arg-type]
        if f.name in ("images", "attachments"):
            continue
        value = getattr(entry, f.name)
        expected = bool if f.name == "is_error" else str
        if not isinstance(value, expected):
            raise ChatFileError(f"{where}.{f.name}: expected {expected.__name__}.")
        if isinstance(value, str):
            value = _string(value, f"{where}.{f.name}")
            cleaned[f.name] = (
                message_text(value) if isinstance(entry, UserEntry) else clean_text(value)
            )
    if isinstance(entry, UserEntry) and len(cleaned["text"]) > max_message_chars:
        raise ChatFileError(
            f"{where}.text: a message of {len(cleaned['text']):,} characters; a message "
            f"is at most {max_message_chars:,}."
        )
    return replace(entry, **cleaned)


def _meta_value(value: object, where: str, depth: int) -> Any:
    """A meta value as stored: JSON data with cleaned strings, finite numbers that fit
    64 bits, and at most `MAX_NESTING` levels (the exporter must write it back)."""
    if depth > MAX_NESTING:
        raise ChatFileError(f"{where}: nested more than {MAX_NESTING} levels deep.")
    if isinstance(value, dict):
        return {
            clean_text(_string(k, f"{where} (a key)")): _meta_value(v, _key(where, k), depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_meta_value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, str):
        return clean_text(_string(value, where))
    if isinstance(value, _OutOfRange) or (isinstance(value, float) and not math.isfinite(value)):
        raise ChatFileError(f"{where}: a number out of range.")
    return value  # a bool, a whole number, a finite float or null


def _key(where: str, key: str) -> str:
    """Where a meta value is, for a message: its key as the page can show it."""
    shown = clean_text(key[:40])
    return f"{where}.{shown}" if shown.isidentifier() else f"{where}[{shown!r}]"


def _string(value: str, where: str) -> str:
    if has_lone_surrogate(value):
        raise ChatFileError(
            f"{where}: holds half of a UTF-16 surrogate pair (such as \\ud800), which is "
            "not a character."
        )
    return value


def _field(document: dict[str, Any], name: str, kind: type, where: str) -> Any:
    value = document.get(name)
    if not isinstance(value, kind):
        prefix = f"{where}." if where else ""
        raise ChatFileError(f"{prefix}{name}: missing or not a {kind.__name__}.")
    return value


def _time(document: dict[str, Any], name: str, default: float) -> float:
    """A time in seconds since 1970; ``default`` (now) when the file has none."""
    value = document.get(name)
    if value is None:
        return default
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_TIME
    ):
        raise ChatFileError(
            f"{name}: not a time (seconds since 1970, a number from 0 to {MAX_TIME:,.0f})."
        )
    return float(value)


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
        # No finished_at: an imported run cost nothing here (`webapp.chats.settings`).
        await tx.execute(
            "INSERT INTO chat_runs (run_id, chat_id, parent_run_id, message_id, seq, selected, "
            "entry_count, entries_json, meta_json, model, tokens_in, tokens_out) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                run.model,
                run.usage.input_tokens if run.usage is not None else None,
                run.usage.output_tokens if run.usage is not None else None,
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
