"""A message form that brings files: the composer's and the edit form's **Attach files**.

Sent as ``multipart/form-data`` (a plain form does that without JavaScript;
htmx with ``hx-encoding``), with the message's fields, any number of parts
in ``files`` and, in the edit form, a ``keep`` value per attachment still
checked. The body is bounded as a whole (the text's limit plus one more file
than a message takes, each at the file limit) and each file on its own, so
the 11th file and a file over the limit reach `webapp.chats.intake`, which
refuses them by name. A form without files is read as every other form.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from webapp.chats.intake import AttachmentLimits, AttachmentRefused, Intake, Taken, Upload
from webapp.chats.text import message_text
from webapp.web.app_state import web
from webapp.web.forms import (
    _CLIENT_ID,
    FormError,
    MessageForm,
    _read_body,
    _too_large,
    _unreadable,
    _utf8,
    byte_limit,
    message_from_fields,
    read_fields,
)

FILES_FIELD = "files"
PARSE_SLICE = 256 * 1024
MAX_PARTS = 100  # file parts a form may hold at all


@dataclass(frozen=True)
class MessageWithFiles:
    message: MessageForm | None  # None: the form has no ``text`` field (a new, empty chat)
    uploads: list[Upload]
    keep: frozenset[str] | None  # the names of the attachments kept (None: the form has none)
    fields: dict[str, str]

    def required(self) -> MessageForm:
        if self.message is None:
            raise FormError(400, "The form has no 'text' field; reload the page and retry.")
        return self.message


async def read_message_with_files(
    request: Request, max_chars: int, limits: AttachmentLimits
) -> MessageWithFiles:
    """The message, its uploads and the names it keeps; FormError when unusable. A
    message with files may have no text."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "multipart/form-data":
        plain = await read_fields(request, byte_limit(max_chars))
        message = message_from_fields(plain, max_chars) if "text" in plain else None
        return MessageWithFiles(message, [], None, plain)
    max_bytes = byte_limit(max_chars) + (limits.max_files + 1) * (limits.max_bytes + 1)
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
        raise FormError(413, _too_large(max_bytes))
    body = await _read_body(request, max_bytes)
    # Declared Latin-1, every field and file name is its bytes one for one; _utf8
    # decodes them strictly (see webapp.web.forms._multipart).
    parser = MultiPartParser(
        Headers({"content-type": request.headers.get("content-type", "") + "; charset=latin-1"}),
        _slices(body),
        max_files=MAX_PARTS,  # the 11th file is refused by name (the body is bounded anyway)
        max_fields=50 + limits.max_files,
        max_part_size=byte_limit(max_chars),
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise FormError(400, _unreadable(exc)) from None
    fields: dict[str, str] = {}
    uploads: list[Upload] = []
    keep: set[str] | None = None
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            try:
                data = await value.read(limits.max_bytes + 1)
            finally:
                await value.close()
            name = _utf8(value.filename or "")
            if key == FILES_FIELD and (name or data):
                uploads.append(Upload(name, data))
            continue
        key, text = _utf8(key), _utf8(value)
        if key == "keep":
            keep = (keep or set()) | {text}
        elif key == "keep_listed":
            keep = keep or set()
        else:
            fields.setdefault(key, text)
    message = _message(fields, max_chars, bool(uploads or keep)) if "text" in fields else None
    return MessageWithFiles(message, uploads, _frozen(keep), fields)


async def _slices(body: bytes) -> AsyncGenerator[bytes, None]:
    """``body`` in pieces the parser takes in a fraction of a millisecond each, the loop
    free between them: 20 MB parsed in one call would stall it for a quarter second."""
    view = memoryview(body)
    for start in range(0, len(body), PARSE_SLICE):
        yield bytes(view[start : start + PARSE_SLICE])
        await asyncio.sleep(0)


def _message(fields: dict[str, str], max_chars: int, with_files: bool) -> MessageForm:
    try:
        return message_from_fields(fields, max_chars)
    except FormError as exc:
        text = message_text(fields.get("text", ""))
        if not with_files or text.strip() or "text" not in fields or exc.status != 400:
            raise
        client_id = fields.get("client_id") or None
        if client_id is not None and not _CLIENT_ID.match(client_id):
            raise
        return MessageForm("", client_id)  # the files are the message


def _frozen(keep: set[str] | None) -> frozenset[str] | None:
    return None if keep is None else frozenset(keep)


def intake_of(request: Request) -> Intake:
    intake = web(request).intake
    if intake is None:
        raise RuntimeError("the app was built without an attachment intake (create_app)")
    return intake


async def read_with_files(request: Request) -> MessageWithFiles:
    """The message form and its uploads, under the app's limits (FormError if unusable)."""
    limits = web(request).intake
    return await read_message_with_files(
        request, web(request).max_message_chars, limits.limits if limits else AttachmentLimits()
    )


async def take(request: Request, form: MessageWithFiles) -> Taken:
    """The uploads read; FormError 400 naming the file that cannot be attached."""
    if not form.uploads:
        return Taken()
    try:
        return await intake_of(request).take(form.uploads)
    except AttachmentRefused as exc:
        raise FormError(400, str(exc), draft=form.message.text if form.message else "") from None
