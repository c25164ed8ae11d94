"""Health, metrics and the access log, as the outermost ASGI middleware (SPEC §17).

- ``GET /healthz``: 200 at once while the process serves; no database call.
- ``GET /readyz``: 200 once start-up is done (runs recovered, MCP servers
  started or failed) and the database answers; else 503.
- ``GET /metrics`` with ``Authorization: Bearer <--metrics-token>``: the
  metrics (`webapp.web.metrics`), for a scraper that has no account. Anyone
  else's ``/metrics`` goes on to the app, whose view admits administrators
  only (`webapp.web.views.operations`).

These answer before the access token, the sign-in and the host check: a load
balancer's probe has none of them, and the answers say nothing of any chat.
Every request's duration is measured here, by route (the route's path
template, never the path itself: chat ids would make a series per chat), and
with ``--access-log`` logged as one line -- the path without its query
string, which may hold the access token.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from webapp.web.metrics import CONTENT_TYPE, Metrics

access_logger = logging.getLogger("webapp.access")
logger = logging.getLogger("webapp.web.operations")

READY_TIMEOUT = 2.0  # seconds the database has to answer a readiness probe


@dataclass
class Health:
    """Whether start-up is done, and how to ask the database if it answers."""

    ping: Callable[[], Awaitable[None]]
    started: bool = False
    metrics: Metrics = field(default_factory=Metrics)
    running: Callable[[], int] = lambda: 0  # runs this process runs now
    waiting: Callable[[], Awaitable[int]] | None = None  # runs waiting for an approval

    async def ready(self) -> str | None:
        """None when ready, else why not."""
        if not self.started:
            return "starting"
        try:
            await _within(self.ping(), READY_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 -- whatever it is, the answer is 503
            self.metrics.database_error()
            logger.warning("readiness: the database does not answer: %s", exc or type(exc).__name__)
            return "the database does not answer"
        return None

    async def metrics_text(self) -> bytes:
        async def none() -> int:
            return 0

        return await self.metrics.text(self.running(), self.waiting or none)


async def _within(work: Awaitable[None], seconds: float) -> None:
    async with asyncio.timeout(seconds):
        await work


class Operations:
    def __init__(
        self,
        app: ASGIApp,
        *,
        health: Health,
        routes: list[BaseRoute],
        metrics_token: str | None = None,
        access_log: bool = False,
    ) -> None:
        self.app = app
        self.health = health
        self.routes = routes
        self.metrics_token = metrics_token
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        own = await self._own(scope)
        if own is not None:
            await own(scope, receive, send)
            return
        metrics = self.health.metrics
        status = 500  # an exception that escapes is answered 500 by the server
        started = time.perf_counter()
        stream = scope["path"].endswith("/events") and scope["method"] == "GET"

        async def observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        if stream:
            metrics.sse_clients.inc()
        try:
            await self.app(scope, receive, observed)
        finally:
            if stream:
                metrics.sse_clients.dec()
            seconds = time.perf_counter() - started
            route = self._route(scope)
            metrics.request_done(scope["method"], route, status, seconds)
            if self.access_log:
                client = scope.get("client")
                access_logger.info(
                    "%s %s %s %d %.1f ms",
                    client[0] if client else "-",
                    scope["method"],
                    scope["path"],
                    status,
                    seconds * 1000,
                )

    async def _own(self, scope: Scope) -> Response | None:
        path, method = scope["path"], scope["method"]
        if method not in ("GET", "HEAD"):
            return None
        if path == "/healthz":
            return PlainTextResponse("ok\n")
        if path == "/readyz":
            why = await self.health.ready()
            if why is None:
                return PlainTextResponse("ready\n")
            return PlainTextResponse(f"not ready: {why}\n", status_code=503)
        if path == "/metrics" and self._bearer(scope):
            return Response(await self.health.metrics_text(), media_type=CONTENT_TYPE)
        return None

    def _bearer(self, scope: Scope) -> bool:
        if self.metrics_token is None:
            return False
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, offered = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    offered.strip().encode(), self.metrics_token.encode()
                )
        return False

    def _route(self, scope: Scope) -> str:
        """The path template of the route that answered (``other`` when none did)."""
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return str(getattr(route, "path", "other"))
        return "other"
