"""``GET /metrics`` for the people of the app (SPEC §17): administrators only.

With accounts (password or header sign-in), an administrator; without (no
sign-in, or the access token), the one user, who runs the app. A scraper
without an account uses ``--metrics-token`` instead, answered before the app
(`webapp.web.operations`). Anyone else gets the same 404 as the admin pages.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from webapp.web.app_state import web
from webapp.web.auth import account_of
from webapp.web.metrics import CONTENT_TYPE
from webapp.web.views.responses import error_page

NOT_HERE = "There is nothing at this address. It may have been deleted."  # as the admin pages


async def metrics(request: Request) -> Response:
    app = web(request)
    if app.auth.accounts:
        account = account_of(request)
        if account is None or not account.is_admin:
            return error_page(request, 404, NOT_HERE)
    return Response(await app.health.metrics_text(), media_type=CONTENT_TYPE)
