"""Each person's API keys: ``/api-keys`` (SPEC §16).

A key is shown once, in the answer to the form that made it (never in an
address, so it stays out of history and logs); the list shows each key's name
and last characters, and **Revoke** ends a key at once, in every process (the
API reads the key's row on each request, `webapp.chats.api_access`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from webapp.web.app_state import web
from webapp.web.auth import account_of, owner_of
from webapp.web.forms import FormError, read_fields
from webapp.web.views.responses import path_for

_MAX_FORM_BYTES = 16 * 1024
NOTICES = {"revoked": "Key revoked: programs using it are refused from now on."}


async def _page(
    request: Request,
    *,
    status: int = 200,
    alert: str = "",
    new_key: str = "",
    new_label: str = "",
) -> Response:
    app = web(request)
    keys = await app.store.api_keys.of(owner_of(request))
    base = str(request.base_url).rstrip("/") + "/v1"
    return app.templates.response(
        "api_keys.html",
        status_code=status,
        keys=keys,
        alert=alert,
        new_key=new_key,
        new_label=new_label,
        notice=NOTICES.get(request.query_params.get("done", ""), ""),
        api_base=base,
        api_keys_page=True,
        account=account_of(request),
    )


async def keys_page(request: Request) -> Response:
    """GET /api-keys: the person's keys, and the form that makes one."""
    return await _page(request)


async def create_key(request: Request) -> Response:
    """POST /api-keys (field ``label``): the new key, shown this once."""
    try:
        fields = await read_fields(request, _MAX_FORM_BYTES)
        made, key = await web(request).store.api_keys.create(
            owner_of(request), fields.get("label", "")
        )
    except FormError as exc:
        return await _page(request, status=exc.status, alert=exc.message)
    except ValueError as exc:
        return await _page(request, status=400, alert=f"Not created: {exc}.")
    response = await _page(request, new_key=key, new_label=made.label)
    response.headers["Cache-Control"] = "no-store"
    return response


async def revoke_key(request: Request) -> Response:
    """POST /api-keys/{key_id}/revoke."""
    if not await web(request).store.api_keys.revoke(
        owner_of(request), request.path_params["key_id"]
    ):
        return await _page(request, status=404, alert="There is no such active key of yours.")
    return RedirectResponse(f"{path_for(request, 'api_keys')}?done=revoked", status_code=303)
