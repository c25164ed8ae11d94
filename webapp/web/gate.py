"""What a request may reach: nothing without a person, and no one else's chat (SPEC §13).

`Gate` runs after authentication (`webapp.web.auth`) and before routing:
- a request with no person behind it reaches only the sign-in page, the
  sign-out and the static files. A page (a plain GET that accepts HTML) is
  redirected to ``/login``; anything else -- a fragment, the event stream, a
  form post -- gets 401 and nothing of any chat. In header mode there is no
  sign-in page: such a request came from somewhere other than the proxy,
  and is refused.
- a request by a person to any route with a ``{chat_id}`` in its path is
  answered 404 unless that chat is theirs, before the view runs. The chat
  layer's own queries already filter by owner (`webapp.chats.users.Owner`);
  this makes a route added later safe even before its view learns to ask.
  It costs one indexed read per such request, and none without accounts.
"""

from __future__ import annotations

from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from webapp.web.app_state import web
from webapp.web.auth import AuthSettings, SignedIn
from webapp.web.security import same_site_path
from webapp.web.views.responses import NO_CHAT, error_page, is_htmx, refuse

SIGN_IN_FIRST = "Sign in first: you are not signed in, or your session has ended."
PROXY_ONLY = (
    "This server signs people in through the proxy in front of it, and this request did "
    "not come through that proxy."
)


class Gate:
    def __init__(self, app: ASGIApp, *, settings: AuthSettings, routes: list[BaseRoute]) -> None:
        self.app = app
        self.settings = settings
        self.routes = routes
        # Without a person: the static files, and in password mode the way in and out.
        self.open_paths = ("/login", "/logout") if settings.mode == "password" else ()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.settings.accounts:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        user = scope.get("user")
        refusal: Response | None = None
        if not isinstance(user, SignedIn):
            if not self._open(request.url.path):
                refusal = self._anonymous(request)
        else:
            chat_id = self._chat_id(scope)
            if chat_id is not None:
                chat = await web(request).chats.get(user.account.owner, chat_id)
                if chat is None:
                    refusal = await refuse(request, 404, NO_CHAT)
        if refusal is not None:
            await refusal(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def _open(self, path: str) -> bool:
        # /v1/: the API, where the key in the request says who asks (webapp.web.api).
        return (
            path.startswith(("/static/", "/v1/"))
            or path in self.open_paths
            or self.settings.public_path(path)
        )

    def _anonymous(self, request: Request) -> Response:
        if self.settings.mode == "header":
            return error_page(request, 401, PROXY_ONLY)
        wants_page = "text/html" in request.headers.get("accept", "")
        if request.method in ("GET", "HEAD") and wants_page and not is_htmx(request):
            target = same_site_path(request)
            if request.url.query:
                target += "?" + request.url.query
            login = request.app.url_path_for("login")
            return RedirectResponse(f"{login}?next={quote(target, safe='/')}", status_code=303)
        response = error_page(request, 401, SIGN_IN_FIRST)
        if is_htmx(request):
            response.headers["HX-Redirect"] = str(request.app.url_path_for("login"))
        return response

    def _chat_id(self, scope: Scope) -> str | None:
        """The ``chat_id`` of the route the router will pick, if it has one."""
        partial: dict[str, str] | None = None
        for route in self.routes:
            match, child = route.matches(scope)
            if match == Match.FULL:
                return child.get("path_params", {}).get("chat_id")
            if match == Match.PARTIAL and partial is None:
                partial = child.get("path_params", {})
        return partial.get("chat_id") if partial is not None else None
