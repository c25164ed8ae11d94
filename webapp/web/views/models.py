"""A chat's model and instructions, its token total, and the Models section of the Tools page.

The picker's change is saved at once (htmx posts the one field, answered 204);
without JavaScript its **Use model** button posts the composer to the same
address, answered with the chat page. The Models section is a partial
(`_models_status.html`) the Tools page includes; its own page here serves it
until then, and its fragment after a **Refresh**.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from webapp.chats.settings import MAX_INSTRUCTIONS_CHARS
from webapp.chats.text import message_text
from webapp.web.app_state import web
from webapp.web.auth import owner_of
from webapp.web.chat_models import Refused, SaveOutcome
from webapp.web.forms import FormError, byte_limit, read_fields
from webapp.web.outcomes import ChatNotFound
from webapp.web.views.responses import (
    NO_CHAT,
    error_page,
    is_htmx,
    path_for,
    redirect,
    refuse,
    to_chat,
)


async def choose_model(request: Request) -> Response:
    """POST /chats/{chat_id}/model (field ``model``, endpoint/model): the chat's model
    from its next run on."""
    app = web(request)
    chat_id = request.path_params["chat_id"]
    try:
        # The whole composer comes along when the no-JavaScript button sends it.
        fields = await read_fields(request, byte_limit(app.max_message_chars))
    except FormError as exc:
        return await refuse(
            request, exc.status, exc.message, chat=await app.chats.get(owner_of(request), chat_id)
        )
    outcome = await app.models.choose(chat_id, fields.get("model", "").strip())
    return await _saved(request, chat_id, outcome)


async def save_instructions(request: Request) -> Response:
    """POST /chats/{chat_id}/instructions (field ``instructions``; empty: the default)."""
    app = web(request)
    chat_id = request.path_params["chat_id"]
    try:
        fields = await read_fields(request, byte_limit(MAX_INSTRUCTIONS_CHARS))
    except FormError as exc:
        return await refuse(
            request, exc.status, exc.message, chat=await app.chats.get(owner_of(request), chat_id)
        )
    if "instructions" not in fields:
        message = "The form has no 'instructions' field; reload the page and retry."
        return await refuse(
            request, 400, message, chat=await app.chats.get(owner_of(request), chat_id)
        )
    text = message_text(fields["instructions"]).strip()
    return await _saved(request, chat_id, await app.models.instruct(chat_id, text))


async def _saved(request: Request, chat_id: str, outcome: SaveOutcome) -> Response:
    if isinstance(outcome, ChatNotFound):
        return await refuse(request, 404, NO_CHAT)
    if isinstance(outcome, Refused):
        chat = await web(request).chats.get(owner_of(request), chat_id)
        return await refuse(request, 400, outcome.message, chat=chat)
    if is_htmx(request):
        return Response(status_code=204)  # saved; nothing on the page changes
    return to_chat(request, chat_id)


async def usage(request: Request) -> Response:
    """GET /chats/{chat_id}/usage: the chat header's token total (fetched after a reply)."""
    app = web(request)
    chat_id = request.path_params["chat_id"]
    chat = await app.chats.get(owner_of(request), chat_id)
    if chat is None:
        return error_page(request, 404, NO_CHAT)
    total = await app.store.settings.usage(chat_id)
    return app.templates.response("_chat_usage.html", chat=chat, chat_usage=total, refresh=False)


async def refresh_models(request: Request) -> Response:
    """POST /tools/models/refresh: ask every endpoint for its models again."""
    app = web(request)
    await app.models.registry.refresh()
    if is_htmx(request):
        return app.templates.response("_models_status.html", **app.models.status())
    return redirect(request, path_for(request, "tools"))
