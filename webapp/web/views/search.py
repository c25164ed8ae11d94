"""Search chats (SPEC §8): a plain GET page, and the live results fragment for htmx."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from webapp.web.app_state import web
from webapp.web.auth import owner_of
from webapp.web.views.responses import is_htmx, page_context

MAX_QUERY_CHARS = 1_000  # longer text is cut; only its first words are searched anyway


async def search(request: Request) -> Response:
    """GET /search?q=...: chats whose title or messages (any version) match."""
    app = web(request)
    query = " ".join(request.query_params.get("q", "")[:MAX_QUERY_CHARS].split())
    hits = await app.chats.search(owner_of(request), query) if query else []
    if is_htmx(request):
        return app.templates.response("_search_update.html", query=query, hits=hits)
    context = await page_context(request, None)
    return app.templates.response("search.html", query=query, hits=hits, **context)
