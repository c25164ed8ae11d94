"""The run stream endpoint: one run's event log as Server-Sent Events (see `webapp.web.sse`)."""

from __future__ import annotations

import anyio
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from webapp.web import sse
from webapp.web.app_state import web
from webapp.web.auth import owner_of
from webapp.web.chat_service import ShownReply
from webapp.web.event_names import DONE


async def events(request: Request) -> Response | sse.RunStream:
    """GET /chats/{chat_id}/runs/{run_id}/events: a run's log as SSE, from any position."""
    app = web(request)
    chat_id, run_id = request.path_params["chat_id"], request.path_params["run_id"]
    owner = owner_of(request)
    state = await app.chats.follow(owner, chat_id, run_id)
    if state is None:
        # Not live (finished earlier, or before a restart) here or, with other
        # processes, in the database.
        stored = await app.chats.stored_reply(owner, chat_id, run_id)
        if not isinstance(stored, ShownReply):
            raise HTTPException(404, f"No run {run_id} in this chat.")
        html = app.fragments.final_reply(chat_id, stored.reply)
        return sse.response(sse.once(DONE, html))
    if state.abandoned:
        # Shutting down with the run still owed: the browser retries, and the next
        # process (which resumes the run) answers with a reset.
        return Response(status_code=503, headers={"Retry-After": "1"})
    position = request.headers.get("last-event-id") or request.query_params.get("after")
    epoch, seq = sse.parse_position(position)
    if epoch == state.epoch and seq > state.seq:  # read ahead of this copy, on another process
        await app.runs.catch_up(state, seq)
    if state.finished and epoch == state.epoch and seq >= state.seq:
        return Response(status_code=204)  # nothing left: tell the browser to stop
    shutdown = anyio.Event()  # sse-starlette sets it when the server shuts down
    return sse.response(sse.stream(app.runs, state, epoch, seq, shutdown), shutdown)
