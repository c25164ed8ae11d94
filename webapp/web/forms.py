"""Reading the app's small forms: bounded, validated, with errors a user can act on.

The body is read with a byte bound before it is parsed, so an oversized post
costs at most that bound in memory. A message that parses but is longer than
the character limit gets a 413 that keeps the text (the page shows it back
in the Message box); only a body beyond the byte bound loses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import Request

_CLIENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TITLE_CHARS = 200
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


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
    """The form's fields (first value of each); FormError 400/413 when unusable."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise FormError(413, _too_large(max_bytes))
    if content_type == "multipart/form-data":
        return await _multipart(request, max_bytes)
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > max_bytes:
            raise FormError(413, _too_large(max_bytes))
    if not body:
        return {}  # a bare button post: no fields at all
    if content_type not in _FORM_TYPES:
        raise FormError(
            400, f"Expected a form post ({_FORM_TYPES[0]}), got {content_type or 'no body type'}."
        )
    try:
        pairs = parse_qsl(
            body.decode("ascii"), keep_blank_values=True, errors="strict", max_num_fields=50
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormError(400, f"The form could not be read ({exc}); reload the page and retry.")
    fields: dict[str, str] = {}
    for key, value in pairs:
        fields.setdefault(key, value)
    return fields


async def _multipart(request: Request, max_bytes: int) -> dict[str, str]:
    try:
        form = await request.form(max_files=0, max_fields=50, max_part_size=max_bytes)
    except MultiPartException as exc:
        raise FormError(400, f"The form could not be read ({exc}); reload the page and retry.")
    fields: dict[str, str] = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            raise FormError(400, "This form takes no file uploads.")
        fields.setdefault(key, value)
    return fields


def _too_large(max_bytes: int) -> str:
    return f"The request is larger than {max_bytes:,} bytes and was not read."


async def read_message(request: Request, max_chars: int) -> MessageForm:
    """``text`` (required, non-empty, at most ``max_chars``) and an optional ``client_id``."""
    return message_from_fields(await read_fields(request, byte_limit(max_chars)), max_chars)


def message_from_fields(fields: dict[str, str], max_chars: int) -> MessageForm:
    """Validate a message form already read (see `read_message`)."""
    if "text" not in fields:
        raise FormError(400, "The form has no 'text' field; reload the page and retry.")
    text = fields["text"].replace("\r\n", "\n").replace("\r", "\n")
    if len(text) > max_chars:
        raise FormError(
            413,
            f"Your message is {len(text):,} characters long; the limit is {max_chars:,}. "
            "Shorten it and send again.",
            draft=text,
        )
    if not text.strip():
        raise FormError(400, "The message is empty: type something to send.", draft=text)
    client_id = fields.get("client_id") or None
    if client_id is not None and not _CLIENT_ID.match(client_id):
        raise FormError(
            400, "The form's client_id is malformed; reload the page and retry.", draft=text
        )
    return MessageForm(text, client_id)


async def read_title(request: Request) -> str:
    fields = await read_fields(request, 16_384)
    if "title" not in fields:
        raise FormError(400, "The form has no 'title' field; reload the page and retry.")
    title = " ".join(fields["title"].split())
    if len(title) > MAX_TITLE_CHARS:
        raise FormError(400, f"A title can be at most {MAX_TITLE_CHARS} characters long.")
    return title
