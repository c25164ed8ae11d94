"""Share links (SPEC §15): the owner's Share page, and the read-only page a link shows.

The owner's routes carry the ``{chat_id}``, so the gate answers another
person's with 404 before they run, and the share store filters by owner too.
The shared page (``/s/{token}``) is read from the database at every request:
a revoked link is 404 at once, in every process. It draws the snapshot with
no control that changes anything, and says to robots and to the pages it links
to as little as it can (noindex; no referrer).
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from webapp.chats.shares import SharedPage
from webapp.chats.text import shortened_title
from webapp.web.app_state import web
from webapp.web.auth import account_of, owner_of
from webapp.web.chat_service import PAGE_RUNS
from webapp.web.view_models import items_from_segments, render_replies
from webapp.web.views.responses import (
    NO_CHAT,
    error_page,
    redirect,
    refuse,
    sidebar_context,
    to_chat,
)

NO_LINK = "There is no shared chat at this address. The link may have been revoked."
SHARED_HEADERS = {"X-Robots-Tag": "noindex", "Referrer-Policy": "no-referrer"}


def _sharing(request: Request) -> bool:
    return web(request).auth.share_links != "off"


async def share_page(request: Request) -> Response:
    """GET /chats/{chat_id}/share: the chat's link, or the button that makes one."""
    app = web(request)
    owner = owner_of(request)
    chat = await app.chats.get(owner, request.path_params["chat_id"])
    if chat is None or not _sharing(request):
        return error_page(request, 404, NO_CHAT if chat is None else "Sharing is switched off.")
    link = await app.store.shares.link(owner, chat.id)
    url = str(request.url_for("shared", token=link.token)) if link is not None else None
    return app.templates.response(
        "share.html",
        chat=chat,
        link=link,
        url=url,
        updated=(
            time.strftime("%Y-%m-%d at %H:%M UTC", time.gmtime(link.updated_at)) if link else ""
        ),
        chats=await app.chats.recent(owner),
        shared_ids=await app.store.shares.shared_chat_ids(owner),
        projects=await app.store.projects.of(owner),
        account=account_of(request),
        can_sign_out=app.auth.mode == "password",
    )


async def publish(request: Request) -> Response:
    """POST /chats/{chat_id}/share: Create link, or Update link to the chat as it is now."""
    chat_id = request.path_params["chat_id"]
    if not _sharing(request):
        return await refuse(request, 404, "Sharing is switched off.")
    link = await web(request).store.shares.publish(owner_of(request), chat_id)
    if link is None:
        return await refuse(request, 404, NO_CHAT)
    return redirect(request, str(request.app.url_path_for("share_page", chat_id=chat_id)))


async def revoke(request: Request) -> Response:
    """POST /chats/{chat_id}/share/revoke: the link is gone, at once, everywhere."""
    chat_id = request.path_params["chat_id"]
    if not await web(request).store.shares.revoke(owner_of(request), chat_id):
        return await refuse(request, 404, NO_CHAT)
    return redirect(request, str(request.app.url_path_for("share_page", chat_id=chat_id)))


async def _page(request: Request) -> SharedPage | None:
    if not _sharing(request):
        return None
    raw = request.query_params.get("before") or ""
    before = int(raw) if raw.isdigit() and len(raw) < 10 else None
    if raw and before is None:
        return None
    return await web(request).store.shares.page(
        request.path_params["token"], before=before, limit=PAGE_RUNS
    )


async def shared(request: Request) -> Response:
    """GET /s/{token}: the snapshot, read-only (``?before=N``: the page before it)."""
    app = web(request)
    page = await _page(request)
    if page is None:
        response = error_page(request, 404, NO_LINK)
        response.headers.update(SHARED_HEADERS)
        return response
    items = items_from_segments(page.segments)
    await render_replies(items)
    account = account_of(request)
    response = app.templates.response(
        "shared.html",
        page=page,
        items=items,
        account=account,
        # Continue this chat: a person with an account of their own, not the owner.
        can_continue=account is not None and account.id != page.owner_id,
    )
    response.headers.update(SHARED_HEADERS)
    return response


async def continue_page(request: Request) -> Response:
    """GET /s/{token}/continue: the confirm step of Continue this chat (a page of the app
    with its usual referrer policy, so the form it posts carries the app's origin)."""
    app = web(request)
    page = await _page(request)
    account = account_of(request)
    if page is None or (account is not None and account.id == page.owner_id):
        response = error_page(request, 404, NO_LINK)
    else:
        response = app.templates.response(
            "continue_shared.html",
            page=page,
            chat=None,
            account=account,
            chats=await app.chats.recent(owner_of(request)),
            **await sidebar_context(request),
            can_sign_out=app.auth.mode == "password",
        )
    response.headers["X-Robots-Tag"] = "noindex"
    return response


async def continue_shared(request: Request) -> Response:
    """POST /s/{token}/continue: a new chat of the viewer's holding the shared path."""
    app = web(request)
    account = account_of(request)
    page = await _page(request)
    if page is None or (account is not None and account.id == page.owner_id):
        return error_page(request, 404, NO_LINK)  # the owner has the chat itself
    title = shortened_title(page.title)  # the shared title, as the viewer saw it
    chat = await app.store.shares.continue_chat(owner_of(request), page.token, title)
    if chat is None:
        return error_page(request, 404, NO_LINK)
    return to_chat(request, chat.id)
