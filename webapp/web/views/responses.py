"""Answers shared by the views: refusals, redirects, and the 404/4xx pages.

A refusal reaches the user the same way whatever sent it: htmx gets the
alert fragment, retargeted (``HX-Retarget``) to the alert next to the
composer, and leaves the typed text where it is; a plain form post gets
the whole chat page with the alert shown and the text back in its box.
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from webapp.web.chats import Chat
from webapp.web.context import web

ALERT_TARGET = "#composer-alert"
NO_CHAT = "This chat does not exist. It may have been deleted."
ERROR_TITLES = {400: "Bad request", 401: "Token required", 403: "Forbidden", 404: "Not found"}


async def load_chat(request: Request) -> Chat | None:
    """The chat named by the ``chat_id`` path parameter, or None."""
    return await web(request).chats.get(request.path_params["chat_id"])


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request", "").lower() == "true"


def redirect(request: Request, url: str) -> Response:
    """303 for a plain form; htmx is told to navigate the whole page."""
    if is_htmx(request):
        return Response(status_code=204, headers={"HX-Redirect": url})
    return RedirectResponse(url, status_code=303)


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
    app = web(request)
    if chat is None:
        return error_page(request, status, message)
    context = await app.page_context(chat)
    edit_draft = draft if editing else None
    response: Response = app.chat_page(
        context,
        status_code=status,
        alert=message,
        draft="" if editing else draft,
        editing=editing,
        edit_draft=edit_draft,
    )
    return response


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
