"""Attached files: a download for the chat's owner.

GET /chats/{chat_id}/files/{file_id} answers the original bytes with
``Content-Disposition: attachment`` (never shown inline: an HTML or SVG file
must not run as the app's page), to the chat's owner only; anyone else, like
a file the chat does not hold, gets 404.
"""

from __future__ import annotations

from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response

from webapp.web.app_state import web
from webapp.web.auth import owner_of
from webapp.web.views.responses import error_page

NO_FILE = "There is no such file in this chat."


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
