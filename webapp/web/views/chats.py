"""Chat pages: a new chat, one chat, its first message, rename, branch and delete."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from webapp.web.app_state import web
from webapp.web.attachment_forms import read_with_files, take
from webapp.web.auth import owner_of
from webapp.web.chat_models import Refused
from webapp.web.chat_service import (
    NO_FILES,
    Branched,
    Busy,
    ChatNotFound,
    OverLimit,
    RunNotFound,
)
from webapp.web.forms import FormError, read_title
from webapp.web.views.responses import (
    BUSY,
    NO_CHAT,
    NotOnPage,
    error_page,
    is_htmx,
    over_limit,
    page_context,
    path_for,
    redirect,
    refuse,
    refuse_form,
    render_chat,
    to_chat,
)

OLDER_GONE = (
    "Those messages are not on this chat's page any more (a version was switched). Reload the chat."
)


async def home(request: Request) -> Response:
    """GET /: an empty new chat; its first message creates it. Recent chats are in the list."""
    return render_chat(request, await page_context(request, None))


async def chat_page(request: Request) -> Response:
    """GET /chats/{chat_id}: its latest messages. With ``?before=RUN`` the page of older
    messages before that one: for htmx (scrolling up) just those messages."""
    app = web(request)
    chat = await app.chats.get(owner_of(request), request.path_params["chat_id"])
    if chat is None:
        return error_page(request, 404, NO_CHAT)
    before = request.query_params.get("before") or None
    try:
        context = await page_context(request, chat, before=before, with_list=not is_htmx(request))
    except NotOnPage:
        return error_page(request, 404, OLDER_GONE)
    if before is not None and is_htmx(request):
        return app.templates.response("_message_items.html", **context)
    return render_chat(request, context)


async def new_chat(request: Request) -> Response:
    """POST /chats: a new chat; with a ``text`` field (the empty home page) it is sent too,
    with the ``preset`` or the ``model`` chosen there."""
    app = web(request)
    try:
        attached = await read_with_files(request)
        form, fields = attached.message, attached.fields
        settings = app.models.for_new_chat(fields.get("preset"), fields.get("model"))
        if isinstance(settings, Refused):
            raise FormError(400, settings.message, draft=form.text if form else "")
        taken = await take(request, attached) if form is not None else None
    except FormError as exc:
        if is_htmx(request):
            return await refuse(request, exc.status, exc.message)
        context = await page_context(request, None)
        return render_chat(
            request, context, status_code=exc.status, alert=exc.message, draft=exc.draft
        )
    owner = owner_of(request)
    if form is None:
        return to_chat(request, (await app.chats.new_chat(owner)).id)
    outcome = await app.chats.start_chat(
        owner, form.text, form.client_id, settings, taken or NO_FILES
    )
    if isinstance(outcome, OverLimit):
        return await over_limit(request, outcome, draft=form.text)
    return to_chat(request, outcome.chat.id)


async def rename(request: Request) -> Response:
    """POST /chats/{chat_id}/rename (field ``title``; empty restores the automatic title)."""
    app = web(request)
    chat_id = request.path_params["chat_id"]
    try:
        title = await read_title(request)
    except FormError as exc:
        return await refuse_form(request, chat_id, exc.status, exc.message)
    outcome = await app.chats.rename(owner_of(request), chat_id, title)
    if isinstance(outcome, ChatNotFound):
        return await refuse(request, 404, NO_CHAT)
    return to_chat(request, chat_id)


async def branch(request: Request) -> Response:
    """POST /chats/{chat_id}/runs/{run_id}/branch: a new chat with the shown
    conversation up to that reply, opened at once."""
    outcome = await web(request).chats.branch(
        owner_of(request), request.path_params["chat_id"], request.path_params["run_id"]
    )
    if isinstance(outcome, ChatNotFound):
        return await refuse(request, 404, NO_CHAT)
    if isinstance(outcome, Busy):
        return await refuse(request, 409, BUSY, chat=outcome.chat)
    if isinstance(outcome, RunNotFound):
        message = "That reply is not on this chat's page any more. Reload the page."
        return await refuse(request, 404, message, chat=outcome.chat)
    if isinstance(outcome, Branched):
        return to_chat(request, outcome.chat.id)
    raise AssertionError(f"unexpected outcome {outcome!r}")


async def delete_confirm(request: Request) -> Response:
    """GET /chats/{chat_id}/delete: the confirm step that works without JavaScript."""
    app = web(request)
    chat = await app.chats.get(owner_of(request), request.path_params["chat_id"])
    if chat is None:
        return error_page(request, 404, NO_CHAT)
    context = await page_context(request, chat)
    return app.templates.response("delete_confirm.html", **context)


async def delete(request: Request) -> Response:
    """POST /chats/{chat_id}/delete: stop its run, drop its messages and checkpoints."""
    outcome = await web(request).chats.delete(owner_of(request), request.path_params["chat_id"])
    if isinstance(outcome, ChatNotFound):
        return await refuse(request, 404, NO_CHAT)
    return redirect(request, path_for(request, "home"))
