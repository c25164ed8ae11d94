"""Attached files: a download for the chat's owner, and the uploads a message form brings.

GET /chats/{chat_id}/files/{file_id} answers the original bytes with
``Content-Disposition: attachment`` (never shown inline: an HTML or SVG file
must not run as the app's page), to the chat's owner only; anyone else, like
a file the chat does not hold, gets 404. `read_with_files` and `take` are what
the send, edit and new-chat views use: a refused file is a 400 that names it,
and nothing has been written by then.
"""

from __future__ import annotations

from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response

from webapp.chats.intake import AttachmentLimits, AttachmentRefused, Intake, Taken
from webapp.web.app_state import web
from webapp.web.attachment_forms import MessageWithFiles, read_message_with_files
from webapp.web.auth import owner_of
from webapp.web.forms import FormError
from webapp.web.views.responses import error_page

NO_FILE = "There is no such file in this chat."


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


async def download(request: Request) -> Response:
    """GET /chats/{chat_id}/files/{file_id}: the file as it was attached."""
    chat_id, file_id = request.path_params["chat_id"], request.path_params["file_id"]
    found = await web(request).store.files.owned(owner_of(request), chat_id, file_id)
    if found is None:
        return error_page(request, 404, NO_FILE)
    return Response(
        found.data,
        media_type=found.media_type,
        headers={
            "Content-Disposition": content_disposition(found.name),
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "private, no-store",
        },
    )


def content_disposition(name: str) -> str:
    """An attachment header for any file name: an ASCII fallback and the name itself
    (RFC 6266 / 5987); quotes, slashes and control characters never reach the header."""
    fallback = "".join(c if (c.isascii() and c.isalnum()) or c in "._- " else "_" for c in name)
    return f"attachment; filename=\"{fallback or 'file'}\"; filename*=UTF-8''{quote(name, safe='')}"
