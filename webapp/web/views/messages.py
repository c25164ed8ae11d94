"""The flows as endpoints: send, stop, edit, regenerate, continue, switch versions, and the
decisions on tools that ask first.

Each endpoint reads its form, calls one `ChatService` operation and turns
the outcome into a response; the service decides (under the chat's lock)
and the view only translates. A user message is addressed by the run_id of
the run whose input it is, so a stale or unknown id is a 404, never a rewind
of the wrong place.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from webapp.chats.store import Chat
from webapp.web.app_state import web
from webapp.web.attachment_forms import read_with_files, take
from webapp.web.auth import owner_of
from webapp.web.chat_service import (
    Busy,
    CannotContinue,
    ChatNotFound,
    MessageNotFound,
    NothingToRegenerate,
    OverLimit,
    RunNotFound,
    ShownReply,
    Started,
    VersionNotFound,
)
from webapp.web.forms import FormError, read_decision, read_run_id
from webapp.web.view_models import UserView
from webapp.web.views.responses import (
    BUSY,
    NO_CHAT,
    chat_updated,
    error_page,
    is_htmx,
    over_limit,
    page_context,
    refuse,
    refuse_form,
    render_chat,
    to_chat,
)

NO_MESSAGE = "That message is not in this chat any more. Reload the page to see the chat as it is."
NO_RUN = "There is no such run in this chat."
NOTHING_TO_REGENERATE = "There is no reply to regenerate yet: send a message first."
NO_VERSION = "That version is not on this chat's page any more. Reload the page to see it as it is."
CANNOT_CONTINUE = (
    "Only the last reply can be continued, and only when it was stopped, cut short "
    "at the model's output limit or cut off while the model was writing."
)
BUSY_SWITCH = "A reply is still running in this chat. Wait for it to finish or press Stop first."

# Every way a flow can say no, with its status and what the user reads.
REFUSALS: dict[type, tuple[int, str]] = {
    ChatNotFound: (404, NO_CHAT),
    Busy: (409, BUSY_SWITCH),
    MessageNotFound: (404, NO_MESSAGE),
    RunNotFound: (404, NO_RUN),
    NothingToRegenerate: (400, NOTHING_TO_REGENERATE),
    VersionNotFound: (404, NO_VERSION),
    CannotContinue: (400, CANNOT_CONTINUE),
}


async def answer(
    request: Request,
    outcome: object,
    *,
    busy: str = BUSY_SWITCH,
    draft: str = "",
    editing: str | None = None,
) -> Response:
    """The refusal an outcome stands for, or else the chat as it now is."""
    if isinstance(outcome, OverLimit):
        return await over_limit(request, outcome, draft=draft, editing=editing)
    chat = getattr(outcome, "chat", None)
    found = REFUSALS.get(type(outcome))
    if found is not None:
        status, message = found
        message = busy if isinstance(outcome, Busy) else message
        return await refuse(request, status, message, chat=chat, draft=draft, editing=editing)
    if not isinstance(chat, Chat):
        raise TypeError(f"no chat in the outcome {outcome!r}")
    return await chat_updated(request, chat, outcome.page if isinstance(outcome, Started) else None)


async def send(request: Request) -> Response:
    """POST /chats/{chat_id}/messages (fields ``text``, ``client_id``)."""
    app = web(request)
    chat_id = request.path_params["chat_id"]
    try:
        attached = await read_with_files(request)
        form = attached.required()
        if attached.uploads and await app.chats.get(owner_of(request), chat_id) is None:
            return await refuse(request, 404, NO_CHAT)  # read no file for a chat not there
        taken = await take(request, attached)
    except FormError as exc:
        chat = await app.chats.get(owner_of(request), chat_id)
        if chat is None:
            return await refuse(request, 404, NO_CHAT)
        return await refuse(request, exc.status, exc.message, chat=chat, draft=exc.draft)
    outcome = await app.chats.send(owner_of(request), chat_id, form.text, form.client_id, taken)
    return await answer(request, outcome, busy=BUSY, draft=form.text)


async def edit_form(request: Request) -> Response:
    """GET /chats/{chat_id}/messages/{run_id}/edit: the edit box (fragment or page)."""
    app = web(request)
    chat = await app.chats.get(owner_of(request), request.path_params["chat_id"])
    if chat is None:
        return error_page(request, 404, NO_CHAT)
    run_id = request.path_params["run_id"]
    # Every message: the one to edit may be on an older page than the latest.
    context = await page_context(request, chat, everything=True)
    item = next(
        (i for i in context["items"] if isinstance(i, UserView) and i.run_id == run_id), None
    )
    if item is None:
        return error_page(request, 404, NO_MESSAGE)
    if is_htmx(request):
        return app.templates.response("_edit_form.html", chat=chat, item=item, edit_draft=None)
    return render_chat(request, context, editing=run_id)


async def edit(request: Request) -> Response:
    """POST /chats/{chat_id}/messages/{run_id}/edit: rewind to before it, run the new text."""
    app = web(request)
    chat_id, run_id = request.path_params["chat_id"], request.path_params["run_id"]
    try:
        attached = await read_with_files(request)
        form = attached.required()
        if attached.uploads and await app.chats.get(owner_of(request), chat_id) is None:
            return await refuse(request, 404, NO_CHAT)
        added = (await take(request, attached)).files
    except FormError as exc:
        chat = await app.chats.get(owner_of(request), chat_id)
        if chat is None:
            return await refuse(request, 404, NO_CHAT)
        return await refuse(
            request, exc.status, exc.message, chat=chat, draft=exc.draft, editing=run_id
        )
    outcome = await app.chats.edit(
        owner_of(request), chat_id, run_id, form.text, attached.keep, added, app.intake
    )
    return await answer(request, outcome, busy=BUSY, draft=form.text, editing=run_id)


async def regenerate(request: Request) -> Response:
    """POST /chats/{chat_id}/regenerate (field ``run_id``; the last reply without it):
    a new version of that reply."""
    app = web(request)
    chat_id = request.path_params["chat_id"]
    try:
        run_id = await read_run_id(request, required=False)
    except FormError as exc:
        return await refuse_form(request, chat_id, exc.status, exc.message)
    outcome = await app.chats.regenerate(owner_of(request), chat_id, run_id)
    return await answer(request, outcome, busy=BUSY)


async def continue_reply(request: Request) -> Response:
    """POST /chats/{chat_id}/runs/{run_id}/continue: the model goes on with that reply."""
    app = web(request)
    chat_id = request.path_params["chat_id"]
    outcome = await app.chats.continue_reply(
        owner_of(request), chat_id, request.path_params["run_id"]
    )
    return await answer(request, outcome)


async def switch(request: Request) -> Response:
    """POST /chats/{chat_id}/switch (field ``run_id``): show that version."""
    app = web(request)
    chat_id = request.path_params["chat_id"]
    try:
        run_id = await read_run_id(request, required=True)
    except FormError as exc:
        return await refuse_form(request, chat_id, exc.status, exc.message)
    outcome = await app.chats.switch(owner_of(request), chat_id, run_id or "")
    return await answer(request, outcome)


async def stop(request: Request) -> Response:
    """POST /chats/{chat_id}/runs/{run_id}/stop: stop and keep what was produced."""
    app = web(request)
    chat_id = request.path_params["chat_id"]
    outcome = await app.chats.stop(owner_of(request), chat_id, request.path_params["run_id"])
    return await _shown(request, chat_id, outcome)


async def decide(request: Request) -> Response:
    """POST /chats/{chat_id}/runs/{run_id}/decide (fields ``call_id``, ``decision``):
    Allow, Always allow or Deny a call that waits; the reply streams on."""
    app = web(request)
    chat_id = request.path_params["chat_id"]
    try:
        form = await read_decision(request)
    except FormError as exc:
        return await refuse(
            request, exc.status, exc.message, chat=await app.chats.get(owner_of(request), chat_id)
        )
    outcome = await app.chats.decide(
        owner_of(request), chat_id, request.path_params["run_id"], form.call_id, form.decision
    )
    return await _shown(request, chat_id, outcome)


async def _shown(request: Request, chat_id: str, outcome: object) -> Response:
    """The reply an outcome shows, for htmx in place of its element; a form goes back to
    the chat."""
    app = web(request)
    if not isinstance(outcome, ShownReply):
        return await answer(request, outcome)
    if not is_htmx(request):
        return to_chat(request, chat_id)
    if outcome.position is not None:
        return HTMLResponse(app.fragments.reply(chat_id, outcome.reply, outcome.position))
    return HTMLResponse(app.fragments.final_reply(chat_id, outcome.reply))
