"""Signing in and out with a password (SPEC §13): ``/login`` and ``/logout``.

The sign-in page is a plain form. Its answer to a wrong name and to a wrong
password is one and the same message (`webapp.chats.sign_in` takes the same
time for both too); a name or an address with too many recent failures gets
429 and a wait. A successful sign-in opens a new session -- a fresh id, the
browser's old session cookie ended -- and goes back to the page that asked.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from webapp.chats.sign_in import SignedIn, Throttled, sign_in
from webapp.chats.users import SESSION_IDLE_SECONDS
from webapp.web.app_state import web
from webapp.web.auth import (
    SESSION_COOKIE,
    account_of,
    clear_session_cookie,
    set_session_cookie,
)
from webapp.web.forms import FormError, read_fields
from webapp.web.views.responses import path_for

WRONG = "Wrong user name or password."
_MAX_FORM_BYTES = 16 * 1024


def _next_path(raw: str | None) -> str:
    """Where to go after signing in: a path on this site, else the home page."""
    if raw and raw.startswith("/") and not raw.startswith(("//", "/\\")) and "\\" not in raw:
        return raw
    return "/"


def _page(request: Request, *, status: int = 200, alert: str = "", name: str = "") -> Response:
    """The sign-in form, with ``name`` back in its box (never the password)."""
    return web(request).templates.response(
        "login.html",
        status_code=status,
        alert=alert,
        user_name=name,
        next=_next_path(request.query_params.get("next")),
    )


async def login_page(request: Request) -> Response:
    """GET /login: the sign-in form (a route in password mode only)."""
    if account_of(request) is not None:
        return RedirectResponse(_next_path(request.query_params.get("next")), status_code=303)
    return _page(request)


async def login(request: Request) -> Response:
    """POST /login (fields ``name``, ``password``, ``next``)."""
    app = web(request)
    try:
        fields = await read_fields(request, _MAX_FORM_BYTES)
    except FormError as exc:
        return _page(request, status=exc.status, alert=exc.message)
    name = fields.get("name", "")
    address = request.client.host if request.client is not None else ""
    outcome = await sign_in(
        app.store.users,
        name,
        fields.get("password", ""),
        address,
        replacing=request.cookies.get(SESSION_COOKIE),
    )
    if isinstance(outcome, Throttled):
        wait = max(1, int(outcome.until - time.time()))
        message = (
            "Too many failed sign-ins for this user name or from this address. "
            f"Try again in {max(1, round(wait / 60))} min."
        )
        response = _page(request, status=429, alert=message, name=name[:64])
        response.headers["Retry-After"] = str(wait)
        return response
    if not isinstance(outcome, SignedIn):
        return _page(request, status=401, alert=WRONG, name=name[:64])
    response = RedirectResponse(_next_path(fields.get("next")), status_code=303)
    set_session_cookie(response, request, outcome.token, SESSION_IDLE_SECONDS // 86400)
    return response


async def logout(request: Request) -> Response:
    """POST /logout: the session ends on the server, and the cookie goes."""
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        await web(request).store.users.close_session(token)
    response = RedirectResponse(path_for(request, "login"), status_code=303)
    clear_session_cookie(response, request)
    return response
