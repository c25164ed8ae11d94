"""Reading the app's small forms: bounded, validated, with errors a user can act on.

The body is read with a byte bound before it is parsed, so an oversized post
costs at most that bound in memory, and with a time bound between its pieces,
so a client that stops sending mid-body gets a 408 instead of holding the
request forever. A message that parses but is longer than the character limit
gets a 413 that keeps the text (the page shows it back in the Message box);
only a body beyond the byte bound loses it.

Both encodings must be UTF-8: a field that is not is refused (400), never
stored as Latin-1 mojibake. User text loses its C0 control characters (but
tab and newlines) on input, so a NUL never reaches the database or the HTML,
and a message of nothing visible is empty. Those rules are the chat library's
(`webapp.chats.text`): an imported chat file meets the same ones.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import unicodedata
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from urllib.parse import parse_qsl

from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect, Request

from webapp.chats.text import MAX_TITLE_CHARS, message_text, title_line
from webapp.chats.tool_approvals import DECISIONS, Decision

_CLIENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
# A urlencoded body larger than this is decoded in a worker thread: a message near the
# limit is a megabyte of %-escapes, which parse_qsl decodes one at a time in Python
# (a tenth of a second the event loop would not serve anyone else).
_LOOP_BYTES = 64 * 1024


def _seconds_from_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a number of seconds greater than 0, got {raw!r}")
    return value


# Seconds to wait for each next piece of a form body before answering 408 (a client
# that sent fewer bytes than its Content-Length would otherwise hold the request
# forever): 10, or the environment variable WEBAPP_BODY_TIMEOUT, read when the app is
# built (`body_timeout`), never at import. Setting this attribute overrides both.
BODY_TIMEOUT: float | None = None
_from_env: list[float] = []  # WEBAPP_BODY_TIMEOUT as read the first time, or the default


def body_timeout() -> float:
    """`BODY_TIMEOUT`, else WEBAPP_BODY_TIMEOUT (read once; a bad value raises
    ValueError, which `create_app` lets stop the app at start), else 10 seconds."""
    if BODY_TIMEOUT is not None:
        return BODY_TIMEOUT
    if not _from_env:
        _from_env.append(_seconds_from_env("WEBAPP_BODY_TIMEOUT", 10.0))
    return _from_env[0]


# Default-ignorable characters that are letters or marks rather than format
# characters (Hangul fillers, the combining grapheme joiner, Khmer inherent vowels,
# Mongolian and other variation selectors), and the blank Braille pattern.
_INVISIBLE = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u2800\u3164\uffa0"
    + "".join(map(chr, range(0xFE00, 0xFE10)))
    + "".join(map(chr, range(0xE0100, 0xE01F0)))
)


class FormError(Exception):
    """A form the app refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str, draft: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.draft = draft  # the user's text, to put back in the box


@dataclass(frozen=True)
class MessageForm:
    text: str
    client_id: str | None


def byte_limit(max_chars: int) -> int:
    # UTF-8 takes up to 4 bytes a character, percent-encoding 3 characters a byte.
    return max_chars * 12 + 65_536


async def read_fields(request: Request, max_bytes: int) -> dict[str, str]:
    """The form's fields (first value of each); FormError 400/408/413 when unusable."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
        raise FormError(413, _too_large(max_bytes))
    body = await _read_body(request, max_bytes)
    if not body:
        return {}  # a bare button post: no fields at all
    if content_type == "multipart/form-data":
        return await _multipart(request, body, max_bytes)
    if content_type not in _FORM_TYPES:
        raise FormError(
            400, f"Expected a form post ({_FORM_TYPES[0]}), got {content_type or 'no body type'}."
        )
    try:
        if len(body) > _LOOP_BYTES:
            pairs = await asyncio.to_thread(_pairs, body)
        else:
            pairs = _pairs(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormError(400, _unreadable(exc))
    fields: dict[str, str] = {}
    for key, value in pairs:
        fields.setdefault(key, value)
    return fields


def _pairs(body: bytes) -> list[tuple[str, str]]:
    return parse_qsl(
        body.decode("ascii"), keep_blank_values=True, errors="strict", max_num_fields=50
    )


async def _read_body(request: Request, max_bytes: int) -> bytes:
    """The whole body, at most ``max_bytes``, each piece within `body_timeout` seconds."""
    body = bytearray()
    loop = asyncio.get_running_loop()
    timeout = body_timeout()
    try:
        async with asyncio.timeout(timeout) as deadline:
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > max_bytes:
                    raise FormError(413, _too_large(max_bytes))
                deadline.reschedule(loop.time() + timeout)
    except TimeoutError:
        raise FormError(
            408,
            f"The form stopped arriving (nothing for {timeout:g} seconds) and was not "
            "read. Check your connection and send it again.",
        ) from None
    except ClientDisconnect:
        # The client is gone: whatever the view answers goes nowhere, but it must not
        # become an unhandled exception (a traceback in the server log).
        raise FormError(400, "The request ended before its form arrived in full.") from None
    return bytes(body)


async def _multipart(request: Request, body: bytes, max_bytes: int) -> dict[str, str]:
    # Starlette decodes a field that is not valid in the declared charset as Latin-1
    # (mojibake). Declared Latin-1 (the last charset parameter wins), every field is
    # its bytes one for one, which _utf8 then decodes strictly.
    content_type = request.headers.get("content-type", "") + "; charset=latin-1"
    parser = MultiPartParser(
        Headers({"content-type": content_type}),
        _once(body),
        max_files=0,
        max_fields=50,
        max_part_size=max_bytes,
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise FormError(400, _unreadable(exc))
    fields: dict[str, str] = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            await value.close()
            raise FormError(400, "This form takes no file uploads.")
        fields.setdefault(_utf8(key), _utf8(value))
    return fields


async def _once(body: bytes) -> AsyncGenerator[bytes, None]:
    yield body


def _utf8(latin1: str) -> str:
    try:
        return latin1.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormError(400, _unreadable(exc)) from None


def _unreadable(reason: Exception) -> str:
    return f"The form could not be read ({reason}); reload the page and retry."


def _too_large(max_bytes: int) -> str:
    return f"The request is larger than {max_bytes:,} bytes and was not read."


def is_blank(text: str) -> bool:
    """True when nothing in ``text`` would show: whitespace, format and filler characters."""
    return all(
        char.isspace() or char in _INVISIBLE or unicodedata.category(char) in ("Cf", "Cc")
        for char in text.strip()  # the ends' spaces in one C call, not one by one
    )


async def read_message(request: Request, max_chars: int) -> MessageForm:
    """``text`` (required, non-empty, at most ``max_chars``) and an optional ``client_id``."""
    return message_from_fields(await read_fields(request, byte_limit(max_chars)), max_chars)


def message_from_fields(fields: dict[str, str], max_chars: int) -> MessageForm:
    """Validate a message form already read (see `read_message`)."""
    if "text" not in fields:
        raise FormError(400, "The form has no 'text' field; reload the page and retry.")
    text = message_text(fields["text"])
    if len(text) > max_chars:
        raise FormError(
            413,
            f"Your message is {len(text):,} characters long; the limit is {max_chars:,}. "
            "Shorten it and send again.",
            draft=text,
        )
    if is_blank(text):
        raise FormError(400, "The message is empty: type something to send.", draft=text)
    client_id = fields.get("client_id") or None
    if client_id is not None and not _CLIENT_ID.match(client_id):
        raise FormError(
            400, "The form's client_id is malformed; reload the page and retry.", draft=text
        )
    return MessageForm(text, client_id)


async def read_title(request: Request) -> str:
    """The ``title`` field on one line; "" (the automatic title) when nothing in it shows."""
    fields = await read_fields(request, 16_384)
    if "title" not in fields:
        raise FormError(400, "The form has no 'title' field; reload the page and retry.")
    title = title_line(fields["title"])
    if is_blank(title):
        return ""
    if len(title) > MAX_TITLE_CHARS:
        raise FormError(400, f"A title can be at most {MAX_TITLE_CHARS} characters long.")
    return title


async def read_run_id(request: Request, *, required: bool) -> str | None:
    """The ``run_id`` field naming a message or reply version (a run id: 32 hex digits)."""
    value = (await read_fields(request, 4_096)).get("run_id") or None
    if value is None and required:
        raise FormError(400, "The form has no 'run_id' field; reload the page and retry.")
    if value is not None and not _RUN_ID.match(value):
        raise FormError(400, "The form's run_id is malformed; reload the page and retry.")
    return value


@dataclass(frozen=True)
class DecisionForm:
    call_id: str
    decision: Decision


async def read_decision(request: Request) -> DecisionForm:
    """An approval card's form: the waiting call (``call_id``, as the model named it) and
    the user's ``decision`` ("allow", "always" or "deny")."""
    fields = await read_fields(request, 4_096)
    call_id, decision = fields.get("call_id", ""), fields.get("decision", "")
    if not call_id or len(call_id) > 1_000:
        raise FormError(400, "The form has no valid 'call_id' field; reload the page and retry.")
    if decision not in DECISIONS:
        raise FormError(400, "The decision must be allow, always or deny; reload the page.")
    return DecisionForm(call_id, decision)  # type: ignore[arg-type]


async def read_upload(request: Request, field: str, max_bytes: int) -> bytes:
    """The content of the one file in field ``field`` of a multipart form, at most
    ``max_bytes``; FormError 400 when there is none, 413 when it is larger."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "multipart/form-data":
        raise FormError(400, "Choose a file to upload (the form must be sent as multipart).")
    overhead = 64 * 1024  # the multipart envelope around the file
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > max_bytes + overhead:
        raise FormError(413, f"The file is larger than {max_bytes:,} bytes and was not read.")
    body = await _read_body(request, max_bytes + overhead)
    parser = MultiPartParser(
        Headers({"content-type": request.headers.get("content-type", "")}),
        _once(body),
        max_files=1,
        max_fields=10,
        max_part_size=overhead,
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise FormError(400, _unreadable(exc))
    upload = form.get(field)
    if not isinstance(upload, UploadFile):
        raise FormError(400, "No file was chosen: choose a chat file, then Import.")
    try:
        data = await upload.read(max_bytes + 1)
    finally:
        await upload.close()
    if len(data) > max_bytes:
        raise FormError(413, f"The file is larger than {max_bytes:,} bytes and was not read.")
    return data
