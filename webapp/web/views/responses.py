"""What the views share: the chat page, refusals, redirects and the error pages.

A refusal reaches the user the same way whatever sent it: htmx gets the
alert fragment, retargeted (``HX-Retarget``) to the alert next to the
composer, and leaves the typed text where it is; a plain form post gets
the whole chat page with the alert shown and the text back in its box.

Redirects are same-site paths built from the routes (never from the Host
header), so a forged Host can not steer a browser elsewhere.
"""

from __future__ import annotations

import math
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from webapp.chats.limits import LimitReached
from webapp.chats.store import Chat, Page
from webapp.web.app_state import new_client_id, web
from webapp.web.auth import account_of, owner_of
from webapp.web.chat_service import PAGE_RUNS, Conversation, OverLimit

ALERT_TARGET = "#composer-alert"
NO_CHAT = "This chat does not exist. It may have been deleted."
BUSY = (
    "A reply is still running in this chat. Wait for it to finish or press Stop, "
    "then send again — your text is still in the box."
)
ERROR_TITLES = {
    400: "Bad request",
    401: "Sign-in required",
    403: "Forbidden",
    404: "Not found",
    408: "Request timeout",
    409: "Busy",
    413: "Too large",
    429: "Limit reached",
}


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request", "").lower() == "true"


def path_for(request: Request, name: str, **params: str) -> str:
    """A same-site path for a route: never an absolute URL made from the Host header."""
    return str(request.app.url_path_for(name, **params))


def redirect(request: Request, path: str) -> Response:
    """303 for a plain form; htmx is told to navigate the whole page."""
    if is_htmx(request):
        return Response(status_code=204, headers={"HX-Redirect": path})
    return RedirectResponse(path, status_code=303)


def to_chat(request: Request, chat_id: str) -> Response:
    return redirect(request, path_for(request, "chat", chat_id=chat_id))


class NotOnPage(LookupError):
    """A page of older messages was asked for before a message that is not shown."""


async def page_context(
    request: Request,
    chat: Chat | None,
    *,
    with_list: bool = True,
    before: str | None = None,
    everything: bool = False,
    read: Page | None = None,
) -> dict[str, Any]:
    """Everything base.html and chat.html need, except the per-request extras
    (``with_list=False``: not the chat list nor the chat's settings, for fragments;
    ``before``: the page of older messages before that run, else `NotOnPage`;
    ``everything``: every message, not just the latest page; ``read``: the latest
    page, already read as the live run began)."""
    app = web(request)
    owner = owner_of(request)
    conversation = None
    if chat is not None:
        limit = None if everything else PAGE_RUNS
        conversation = await app.chats.conversation(
            owner, chat, before=before, limit=limit, read=read
        )
        if conversation is None:
            raise NotOnPage(before)
    # The chat's settings and total: a page's header and composer, not a fragment's.
    settings = await app.models.settings(chat.id) if chat is not None and with_list else None
    total = await app.store.settings.usage(chat.id) if chat is not None and with_list else None
    return {
        **(await sidebar_context(request) if with_list else {}),
        "sharing": app.auth.share_links != "off",
        "chat_project": (
            await app.store.projects.project_of(chat.id) if chat is not None and with_list else None
        ),
        "chat": chat,
        "account": account_of(request),
        "can_sign_out": app.auth.mode == "password",
        "chats": await app.chats.recent(owner) if with_list else [],
        "items": conversation.items if conversation else [],
        "live": conversation.live if conversation else None,
        "earlier": conversation.earlier if conversation else None,
        "before": before,
        "client_id": new_client_id(),
        "max_message_chars": app.max_message_chars,
        "model_description": app.models.registry.description() or app.model_description,
        "picker": app.models.picker(settings),
        "chat_settings": settings,
        "chat_usage": total,
        "presets": app.models.registry.presets if chat is None else (),
        "default_instructions": app.models.default_instructions,
    }


async def sidebar_context(request: Request) -> dict[str, Any]:
    """What the sidebar shows beside the chat list: the person's projects, and which of
    their chats are shared (SPEC §15)."""
    store = web(request).store
    owner = owner_of(request)
    return {
        "projects": await store.projects.of(owner),
        "shared_ids": await store.shares.shared_chat_ids(owner),
    }


def live_position(context: dict[str, Any]) -> str | None:
    """Where the page's live reply streams from. Call with no await since the context
    was read: the reply drawn and its position then match."""
    live = context["live"]
    return live.position if live is not None and not live.finished else None


def render_chat(
    request: Request,
    context: dict[str, Any],
    *,
    status_code: int = 200,
    alert: str = "",
    draft: str = "",
    editing: str | None = None,
    edit_draft: str | None = None,
) -> Response:
    return web(request).templates.response(
        "chat.html",
        status_code=status_code,
        alert=alert,
        draft=draft,
        editing=editing,
        edit_draft=edit_draft,
        position=live_position(context),
        **context,
    )


async def chat_updated(
    request: Request, conversation: Conversation | Chat, read: Page | None = None
) -> Response:
    """After a change: htmx gets the message list (and fresh composer bits); forms a 303.
    ``read``: the latest page, if the change read it (`Started.page`)."""
    chat = conversation.chat if isinstance(conversation, Conversation) else conversation
    if not is_htmx(request):
        return to_chat(request, chat.id)
    context = await page_context(request, chat, with_list=False, read=read)
    # The chat's item moves to the top of the list: still marked Shared if it is.
    shared = await web(request).store.shares.link(owner_of(request), chat.id)
    return web(request).templates.response(
        "_chat_update.html",
        position=live_position(context),
        editing=None,
        edit_draft=None,
        **{**context, "shared_ids": {chat.id} if shared is not None else set()},
    )


def alert_fragment(request: Request, status: int, message: str) -> Response:
    return web(request).templates.response(
        "_alert.html",
        status_code=status,
        headers={"HX-Retarget": ALERT_TARGET, "HX-Reswap": "outerHTML"},
        alert=message,
        oob=False,
    )


async def refuse(
    request: Request,
    status: int,
    message: str,
    *,
    chat: Chat | None = None,
    draft: str = "",
    editing: str | None = None,
) -> Response:
    """Say no, keep the user's text, and show why (see the module docstring)."""
    if is_htmx(request):
        return alert_fragment(request, status, message)
    if chat is None:
        return error_page(request, status, message)
    return render_chat(
        request,
        await page_context(request, chat),
        status_code=status,
        alert=message,
        draft="" if editing else draft,
        editing=editing,
        edit_draft=draft if editing else None,
    )


def limit_notice(reached: LimitReached, now: float | None = None) -> str:
    """Which limit a send met, and when it lets the next one through."""
    if reached.kind == "runs":
        return (
            f"Limit reached: at most {reached.limit} of your replies may run at once. "
            "Send again when one of them finishes (or stop one); your text is still in the box."
        )
    left = max(60.0, (reached.resets_at or 0.0) - (now if now is not None else time.time()))
    hours, minutes = divmod(math.ceil(left / 60), 60)
    wait = f"{hours} h {minutes} min" if hours else f"{minutes} min"
    return (
        f"Limit reached: {reached.limit:,} tokens a day, and your replies have used "
        f"{reached.used:,} today. It resets at 00:00 UTC, in {wait}; your text is still "
        "in the box."
    )


async def over_limit(
    request: Request, outcome: OverLimit, *, draft: str = "", editing: str | None = None
) -> Response:
    """429 with the notice; nothing was written, and the text stays where it was."""
    notice = limit_notice(outcome.reached)
    if outcome.chat is None and not is_htmx(request):  # the home page's first message
        context = await page_context(request, None)
        response = render_chat(request, context, status_code=429, alert=notice, draft=draft)
    else:
        response = await refuse(
            request, 429, notice, chat=outcome.chat, draft=draft, editing=editing
        )
    if outcome.reached.resets_at is not None:
        response.headers["Retry-After"] = str(max(1, int(outcome.reached.resets_at - time.time())))
    return response


async def refuse_form(request: Request, chat_id: str, status: int, message: str) -> Response:
    """A form that cannot be read, posted to a chat: 404 first if the chat is not there
    (or not the asker's), as every other answer about a chat one may not see."""
    chat = await web(request).chats.get(owner_of(request), chat_id)
    if chat is None:
        return await refuse(request, 404, NO_CHAT)
    return await refuse(request, status, message, chat=chat)


def error_page(request: Request, status: int, message: str) -> Response:
    title = ERROR_TITLES.get(status, "Error")
    context: dict[str, Any] = {"status": status, "title": title, "message": message}
    return web(request).templates.response("error.html", status_code=status, **context)


async def http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's HTTPException (unknown route, wrong method) as our page or alert."""
    if not isinstance(exc, HTTPException):
        raise exc
    message = str(exc.detail) if exc.detail else "Something went wrong."
    if exc.status_code == 404 and message == "Not Found":
        message = "There is nothing at this address. It may have been deleted."
    if is_htmx(request):
        response = alert_fragment(request, exc.status_code, message)
    else:
        response = error_page(request, exc.status_code, message)
    if exc.headers:
        response.headers.update(exc.headers)
    return response
