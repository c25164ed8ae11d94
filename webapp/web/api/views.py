"""The API's routes (SPEC §16): OpenAI's ``/v1/models`` and ``/v1/chat/completions``,
and this app's ``/v1/runs/{run_id}/events`` and ``/cancel``.

Who asks is the API key in ``Authorization: Bearer KEY`` (`api_owner`), not
a browser's cookie: the browser's token check and sign-in gate let ``/v1/``
through to here (`webapp.web.security`, `webapp.web.gate`). Every refusal is
JSON in OpenAI's shape (`webapp.web.api.wire.ApiError`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from webapp.chats.api_access import ApiRun
from webapp.chats.limits import LimitReached
from webapp.chats.users import EVERY_CHAT, Owner
from webapp.web import sse
from webapp.web.api import wire
from webapp.web.api.service import ApiService, Ended
from webapp.web.api.wire import ApiError
from webapp.web.app_state import web
from webapp.web.views.responses import limit_notice

API_PREFIX = "/v1/"


def api_routes() -> list[Route]:
    return [
        Route("/v1/models", models, methods=["GET"], name="api_models"),
        Route("/v1/chat/completions", completions, methods=["POST"], name="api_completions"),
        Route("/v1/runs/{run_id}/events", run_events, methods=["GET"], name="api_run_events"),
        Route("/v1/runs/{run_id}/cancel", cancel, methods=["POST"], name="api_cancel"),
    ]


def _api(request: Request) -> ApiService:
    found = web(request).api
    if found is None:
        raise RuntimeError("the app was built without its API")
    return found


async def api_owner(request: Request) -> Owner:
    """Whose request this is: the key's person; `ApiError` 401 without a valid key."""
    app = web(request)
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    key = key.strip() if scheme.lower() == "bearer" else ""
    if app.auth.mode == "none":
        return EVERY_CHAT  # the one user of an app without accounts: no key needed
    if not key:
        raise ApiError(
            401,
            "Send an API key: 'Authorization: Bearer KEY' (make one on the API keys page).",
            "missing_api_key",
        )
    token = _api(request).token
    if token is not None and hmac.compare_digest(key.encode(), token.encode()):
        return EVERY_CHAT
    holder = await app.store.api_keys.holder(key)
    if holder is None or (app.auth.accounts and holder.user_id is None):
        raise ApiError(401, "This API key is not valid, or it was revoked.", "invalid_api_key")
    return holder


async def models(request: Request) -> Response:
    try:
        await api_owner(request)
    except ApiError as error:
        return error.response()
    return JSONResponse(wire.models_list(_api(request).model_names(), int(time.time())))


async def completions(request: Request) -> Response | sse.RunStream:
    api = _api(request)
    try:
        owner = await api_owner(request)
        raw = await _body(request)
        parsed = wire.parse_request(raw, web(request).max_message_chars)
        key = wire.idempotency_key(request.headers.get("idempotency-key"))
        run = await api.start(owner, parsed, key)
    except ApiError as error:
        return error.response()
    except LimitReached as reached:
        return ApiError(429, limit_notice(reached), f"{reached.kind}_limit").response()
    headers = {"X-Run-Id": run.run_id}
    if parsed.stream:
        return _streamed(api, run, None, parsed.include_usage, headers)
    end = await _ended(api, run, request)
    if end is None:
        return Response(status_code=499)  # the client left; the run goes on (or is stopped)
    if end.error is not None:
        return ApiError(502, end.error, "run_failed", "server_error").response(headers)
    reply, calls = end.as_reply(run.run_id), list(end.calls)
    answer = wire.completion(run.run_id, int(run.created_at), run.model, reply, calls)
    return JSONResponse(answer, headers=headers)


async def run_events(request: Request) -> Response | sse.RunStream:
    """The rest of a run's stream after ``Last-Event-ID`` (all of it without one)."""
    api = _api(request)
    try:
        owner = await api_owner(request)
        run = await api.find(owner, request.path_params["run_id"])
        after = _position(request.headers.get("last-event-id"))
    except ApiError as error:
        return error.response()
    usage = request.query_params.get("include_usage", "true").lower() != "false"
    return _streamed(api, run, after, usage, {"X-Run-Id": run.run_id})


async def cancel(request: Request) -> Response:
    api = _api(request)
    try:
        owner = await api_owner(request)
        run = await api.find(owner, request.path_params["run_id"])
    except ApiError as error:
        return error.response()
    await api.cancel(run)
    end = await api.ended(run)
    return JSONResponse(
        {
            "id": wire.completion_id(run.run_id),
            "object": "run.cancelled",
            "run_id": run.run_id,
            "content": end.text,
            "usage": wire.usage_json(end.usage),
        }
    )


def _streamed(
    api: ApiService, run: ApiRun, after: int | None, include_usage: bool, headers: dict[str, str]
) -> sse.RunStream:
    stream = sse.response(_encoded(api.chunks(run, after, include_usage)))
    stream.response.headers.update(headers)
    return stream


async def _encoded(
    chunks: AsyncIterator[tuple[int | None, dict[str, object] | str]],
) -> AsyncIterator[bytes]:
    async for position, data in chunks:
        text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        head = f"id: {position}\n" if position is not None else ""
        yield f"{head}data: {text}\n\n".encode()


async def _ended(api: ApiService, run: ApiRun, request: Request) -> Ended | None:
    """The run's answer, or None if the client went away first (the run is then
    watched as an orphan)."""
    waiting = asyncio.ensure_future(api.ended(run))
    try:
        while not waiting.done():
            done, _ = await asyncio.wait({waiting}, timeout=0.5)
            if not done and await request.is_disconnected():
                waiting.cancel()
                return None
        return waiting.result()
    finally:
        if not waiting.done():
            waiting.cancel()


async def _body(request: Request) -> bytes:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > wire.MAX_BODY_BYTES:
        raise ApiError(413, "The request body is too large.", "body_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > wire.MAX_BODY_BYTES:
            raise ApiError(413, "The request body is too large.", "body_too_large")
    return bytes(body)


def _position(value: str | None) -> int | None:
    if value is None or not value.strip():
        return None
    if not value.strip().isdigit():
        raise wire.invalid(f"Last-Event-ID must be a number this API sent, got {value[:40]!r}.")
    return int(value.strip())
