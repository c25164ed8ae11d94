"""The Tools page (SPEC §11, §12): each MCP server with its state and its tools, the
built-ins, and each model endpoint with its models or why they are missing."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from webapp.web.app_state import web
from webapp.web.views.responses import page_context


async def tools_page(request: Request) -> Response:
    """GET /tools: what the model may call, and what asks first."""
    app = web(request)
    servers = app.agents.servers
    context = await page_context(request, None)
    return app.templates.response(
        "tools.html",
        servers=list(servers.states.values()) if servers is not None else [],
        builtin_tools=app.agents.builtin_tools,
        tools_page=True,
        **app.models.status(),
        **context,
    )
