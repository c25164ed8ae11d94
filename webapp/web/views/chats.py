"""Chat pages: the list, one chat, new chat, rename and delete (with a confirm step)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from webapp.web.chats import Chat
from webapp.web.context import web
from webapp.web.forms import (
    FormError,
    MessageForm,
    byte_limit,
    message_from_fields,
    read_fields,
    read_title,
)
from webapp.web.render import UserView, title_from_text
from webapp.web.views.messages import start_checked
from webapp.web.views.responses import (
    NO_CHAT,
    error_page,
    is_htmx,
    load_chat,
    redirect,
    refuse,
)


async def home(request: Request) -> Response:
    """GET /: the most recent chat, or an empty page whose first message creates one."""
    app = web(request)
    chats = await app.chats.recent(limit=1)
    if chats:
        return RedirectResponse(request.url_for("chat", chat_id=chats[0].id), status_code=303)
    response: Response = app.chat_page(await app.page_context(None))
    return response


async def chat_page(request: Request) -> Response:
    """GET /chats/{chat_id}."""
    chat = await load_chat(request)
    if chat is None:
        return error_page(request, 404, NO_CHAT)
    app = web(request)
    response: Response = app.chat_page(await app.page_context(chat))
    return response


async def new_chat(request: Request) -> Response:
    """POST /chats: a new chat; with a ``text`` field (the empty home page) it is sent too."""
    app = web(request)
    try:
        fields = await read_fields(request, byte_limit(app.max_message_chars))
        form: MessageForm | None = None
        if "text" in fields:
            form = message_from_fields(fields, app.max_message_chars)
    except FormError as exc:
        if is_htmx(request):
            return await refuse(request, exc.status, exc.message)
        context = await app.page_context(None)
        response: Response = app.chat_page(
            context, status_code=exc.status, alert=exc.message, draft=exc.draft
        )
        return response
    chat = await app.chats.create()
    if form is not None:
        async with app.runs.lock(chat.id):
            await start_checked(app, chat, form.text, client_id=form.client_id)
    return redirect(request, str(request.url_for("chat", chat_id=chat.id)))


async def rename(request: Request) -> Response:
    """POST /chats/{chat_id}/rename (field ``title``; empty restores the automatic title)."""
    chat = await load_chat(request)
    if chat is None:
        return await refuse(request, 404, NO_CHAT)
    try:
        title = await read_title(request)
    except FormError as exc:
        return await refuse(request, exc.status, exc.message, chat=chat)
    app = web(request)
    if not title:
        title = await _automatic_title(request, chat)
    await app.chats.rename(chat.id, title)
    return redirect(request, str(request.url_for("chat", chat_id=chat.id)))


async def _automatic_title(request: Request, chat: Chat) -> str:
    items, _ = await web(request).chat_items(chat)
    first = next((i for i in items if isinstance(i, UserView)), None)
    return title_from_text(first.text) if first is not None else ""


async def delete_confirm(request: Request) -> Response:
    """GET /chats/{chat_id}/delete: the confirm step that works without JavaScript."""
    chat = await load_chat(request)
    if chat is None:
        return error_page(request, 404, NO_CHAT)
    app = web(request)
    context = await app.page_context(chat)
    return app.templates.response("delete_confirm.html", **context)


async def delete(request: Request) -> Response:
    """POST /chats/{chat_id}/delete: stop its run, drop its messages and checkpoints."""
    chat = await load_chat(request)
    if chat is None:
        return await refuse(request, 404, NO_CHAT)
    app = web(request)
    if chat.active_run_id:
        await app.runs.stop(chat.id, chat.active_run_id)
    async with app.runs.lock(chat.id):
        segments = await app.session.segments(chat.id)
        await app.runs.discard(chat.id, [s.run_id for s in segments])
        await app.session.clear(chat.id)
        await app.chats.delete(chat.id)
        app.runs.forget_chat(chat.id)
    return redirect(request, str(request.url_for("home")))
