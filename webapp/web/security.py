"""Access token, cross-origin refusal and security headers, as one ASGI middleware.

- Token: when the app has one (the CLI insists on it for a non-loopback
  host), every request needs it. Visiting any page with ``?token=...`` sets
  an HttpOnly, SameSite=Strict cookie and redirects to the same address
  without the token, so it does not linger in history or logs. That redirect
  is always to a path on this site, whatever the request's path looked like.
  Paths said ``public`` (a shared page under ``--share-links anyone``) need none.
- Cross-origin: a state-changing request (anything but GET/HEAD/OPTIONS)
  whose ``Origin`` -- or ``Referer`` when there is no Origin -- names another
  origin is refused with 403. Requests with neither (curl, tests) pass: a
  browser always sends Origin on a cross-site POST, which is the attack.
- Host: when the app is given ``allowed_hosts`` (the CLI always does, unless
  told ``--allowed-hosts '*'``), any other Host header is refused, which stops
  DNS rebinding and keeps foreign names out of the addresses the app builds.
- Headers: a Content-Security-Policy with no inline script or style, no
  framing, and same-origin everything, on every response -- a 500 included:
  an exception that escapes the app is answered here with the error page
  (then re-raised so the server logs it), because Starlette's own 500 answer
  comes from outside every user middleware and would carry no headers.
"""

from __future__ import annotations

import hmac
import html
import logging
from collections.abc import Callable, Sequence
from urllib.parse import quote, urlencode, urlsplit

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

COOKIE = "webapp_token"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
}
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
SERVER_ERROR = (
    "Something went wrong on the server; the error has been logged. Reload the page to try again."
)

logger = logging.getLogger("webapp.web.security")

ErrorRenderer = Callable[[int, str], str]


def _origin_of(url: str) -> str | None:
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def own_origin(request: Request) -> str:
    host = request.headers.get("host") or request.url.netloc
    return f"{request.url.scheme}://{host.lower()}"


def cross_origin(request: Request) -> str | None:
    """The foreign origin a state-changing request came from, or None if it is ours."""
    claimed = request.headers.get("origin")
    if claimed is None:
        referer = request.headers.get("referer")
        if referer is None:
            return None
        claimed = _origin_of(referer) or referer
    if claimed.lower() == own_origin(request):
        return None
    return claimed


def request_hostname(request: Request) -> str:
    """The Host header's name without the port (IPv6 brackets removed), lower case."""
    host = (request.headers.get("host") or "").lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def same_site_path(request: Request) -> str:
    """The request's path as sent, safe as a redirect target: one leading "/", no more.

    As a Location, "//evil.example/" is another site (protocol-relative) and so is
    "/\\evil.example/" (browsers read a backslash as a slash).
    """
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if raw else quote(request.url.path)
    return "/" + path.lstrip("/\\")


class SecurityMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        render_error: ErrorRenderer,
        allowed_hosts: Sequence[str] | None = None,
        public: Callable[[str], bool] | None = None,
    ) -> None:
        self.app = app
        self.token = token
        self.public = public or (lambda path: False)  # paths the token does not guard
        self.render_error = render_error
        self.allowed_hosts = {h.lower().strip("[]") for h in allowed_hosts or ()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        try:
            refusal = self._check(Request(scope))
            if refusal is not None:
                await refusal(scope, receive, send_with_headers)
                return
            await self.app(scope, receive, send_with_headers)
        except Exception:
            if not started:
                await self._server_error()(scope, receive, send_with_headers)
            raise  # Starlette sees the response started and sends nothing; the server logs it

    def _check(self, request: Request) -> Response | None:
        if self.allowed_hosts and request_hostname(request) not in self.allowed_hosts:
            # A page on another site whose name was re-pointed at this machine (DNS
            # rebinding) would otherwise count as "same origin" here.
            return self._error(400, "This server does not answer to that host name.")
        # The API answers for itself: its key is the token (webapp.web.api.views).
        if (
            self.token is not None
            and not request.url.path.startswith("/v1/")
            and not self.public(request.url.path)
        ):
            offered = request.query_params.get("token")
            cookie = request.cookies.get(COOKIE)
            if offered is not None and _same(offered, self.token):
                if request.method in ("GET", "HEAD"):
                    return self._accept_token(request)
            elif cookie is None or not _same(cookie, self.token):
                message = (
                    "This server needs its access token. Open the address the server "
                    "printed at start-up (it ends in ?token=...), or ask whoever runs it."
                )
                return self._error(401, message)
        if request.method not in SAFE_METHODS:
            foreign = cross_origin(request)
            if foreign is not None:
                message = (
                    f"Refused: this request came from another site ({foreign}). "
                    "Use the app's own pages to make changes."
                )
                return self._error(403, message)
        return None

    def _accept_token(self, request: Request) -> Response:
        query = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = same_site_path(request) + (f"?{urlencode(query)}" if query else "")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE,
            self.token or "",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    def _error(self, status: int, message: str) -> Response:
        return HTMLResponse(self.render_error(status, message), status_code=status)

    def _server_error(self) -> Response:
        try:
            return self._error(500, SERVER_ERROR)
        except Exception:  # the error page itself is broken: say it in plain HTML
            logger.exception("The error page could not be rendered")
            page = f"<!doctype html><title>Server error</title><p>{html.escape(SERVER_ERROR)}</p>"
            return HTMLResponse(page, status_code=500)


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))
