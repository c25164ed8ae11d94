"""A chat as a file: Markdown and JSON export downloads, and JSON import (SPEC §8)."""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import Response

from webapp.chats import file_format
from webapp.web.app_state import web
from webapp.web.auth import owner_of
from webapp.web.chat_service import BadChatFile
from webapp.web.forms import FormError, read_upload
from webapp.web.views.responses import (
    NO_CHAT,
    error_page,
    page_context,
    refuse,
    render_chat,
    to_chat,
)


async def export_markdown(request: Request) -> Response:
    """GET /chats/{chat_id}/export.md: the shown conversation."""
    return await _export(request, "md")


async def export_json(request: Request) -> Response:
    """GET /chats/{chat_id}/export.json: the whole chat, every version."""
    return await _export(request, "json")


async def _export(request: Request, kind: str) -> Response:
    chat_id = request.path_params["chat_id"]
    chat = await web(request).chats.export(owner_of(request), chat_id)
    if chat is None:
        return error_page(request, 404, NO_CHAT)
    if kind == "md":
        body, media_type = file_format.to_markdown(chat), "text/markdown; charset=utf-8"
    else:
        body, media_type = file_format.to_json(chat_id, chat), "application/json"
    name = _file_name(chat.title) + "." + kind
    return Response(
        body,
        media_type=media_type,
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


def _file_name(title: str) -> str:
    """A safe ASCII file name from a title (the header cannot carry anything else)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()[:60]
    return slug or "chat"


async def import_chat(request: Request) -> Response:
    """POST /chats/import (multipart, field ``file``): a JSON export becomes a new chat."""
    app = web(request)
    try:
        data = await read_upload(request, "file", _max_import_bytes(request))
    except FormError as exc:
        return await _refuse_import(request, exc.status, exc.message)
    outcome = await app.chats.import_chat(
        owner_of(request), data, max_message_chars=app.max_message_chars, intake=app.intake
    )
    if isinstance(outcome, BadChatFile):
        return await _refuse_import(request, 400, f"Not imported: {outcome.message}")
    return to_chat(request, outcome.chat.id)


def _max_import_bytes(request: Request) -> int:
    """A chat file's limit: the text's, plus a message's worth of files in base64."""
    intake = web(request).intake
    if intake is None:
        return file_format.MAX_FILE_BYTES
    return file_format.MAX_FILE_BYTES + intake.limits.max_files * intake.limits.max_bytes * 4 // 3


async def _refuse_import(request: Request, status: int, message: str) -> Response:
    """The home page with the reason next to the composer; nothing was written."""
    if request.headers.get("hx-request", "").lower() == "true":
        return await refuse(request, status, message)
    return render_chat(
        request, await page_context(request, None), status_code=status, alert=message
    )
