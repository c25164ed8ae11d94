"""The four flows of SPEC §6: send, stop, edit and resend, regenerate.

Each state change runs under the chat's lock and first settles a run that
ended a moment ago, so "is a run active?" is answered from durable state:
while one is, send / edit / regenerate are refused with 409 and never
interleaved. A user message is addressed by the run_id of the run whose
input it is (each run's input is exactly one UserEntry, the first of its
segment), so a stale or unknown id is a 404, never a rewind of the wrong
place.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from webapp.stores.session import Segment
from webapp.transcript import UserEntry
from webapp.web.chats import Chat
from webapp.web.context import WebApp, web
from webapp.web.forms import FormError, read_message
from webapp.web.render import UserView, title_from_text
from webapp.web.runs import RunState
from webapp.web.views.responses import NO_CHAT, error_page, is_htmx, load_chat, refuse

BUSY = (
    "A reply is still running in this chat. Wait for it to finish or press Stop, "
    "then send again — your text is still in the box."
)
NO_MESSAGE = "That message is not in this chat any more. Reload the page to see the chat as it is."
NOTHING_TO_REGENERATE = "There is no reply to regenerate yet: send a message first."


async def start_checked(
    app: WebApp, chat: Chat, text: str, *, client_id: str | None = None
) -> tuple[RunState | None, bool]:
    """Start a run unless one is active (chat lock held): (state, refused_as_busy).

    A client id seen before returns (None, False): that message was already
    sent, and a retried POST must not start a second run.
    """
    if client_id is not None and await app.chats.sent_run(chat.id, client_id) is not None:
        return None, False
    await app.runs.settle(chat.id)
    current = await app.chats.get(chat.id)
    if current is None:
        return None, False
    if current.active_run_id:
        return None, True
    title = None if current.title else title_from_text(text)
    state = await app.runs.start(chat.id, text, client_id=client_id, title=title)
    return state, False


async def chat_update(request: Request, chat_id: str) -> Response:
    """After a change: htmx gets the message list (and fresh composer bits); forms a 303."""
    app = web(request)
    if not is_htmx(request):
        return RedirectResponse(request.url_for("chat", chat_id=chat_id), status_code=303)
    chat = await app.chats.get(chat_id)
    if chat is None:
        return await refuse(request, 404, NO_CHAT)
    context = await app.page_context(chat)
    live: RunState | None = context["live"]
    # No await between reading the live reply and its position: they match.
    position = live.position if live is not None and not live.finished else None
    return app.templates.response(
        "_chat_update.html", position=position, editing=None, edit_draft=None, **context
    )


async def send(request: Request) -> Response:
    """POST /chats/{chat_id}/messages (fields ``text``, ``client_id``)."""
    app = web(request)
    chat = await load_chat(request)
    if chat is None:
        return await refuse(request, 404, NO_CHAT)
    try:
        form = await read_message(request, app.max_message_chars)
    except FormError as exc:
        return await refuse(request, exc.status, exc.message, chat=chat, draft=exc.draft)
    async with app.runs.lock(chat.id):
        _, busy = await start_checked(app, chat, form.text, client_id=form.client_id)
    if busy:
        return await refuse(request, 409, BUSY, chat=chat, draft=form.text)
    return await chat_update(request, chat.id)


def _find_input(segments: list[Segment], run_id: str) -> tuple[int, Segment] | None:
    """(flat index in load(), segment) of the user message that is ``run_id``'s input."""
    start = 0
    for seg in segments:
        if seg.run_id == run_id:
            if seg.entries and isinstance(seg.entries[0], UserEntry):
                return start, seg
            return None
        start += len(seg.entries)
    return None


async def edit_form(request: Request) -> Response:
    """GET /chats/{chat_id}/messages/{run_id}/edit: the edit box (fragment or page)."""
    app = web(request)
    chat = await load_chat(request)
    if chat is None:
        return error_page(request, 404, NO_CHAT)
    run_id = request.path_params["run_id"]
    context = await app.page_context(chat)
    item = next(
        (i for i in context["items"] if isinstance(i, UserView) and i.run_id == run_id), None
    )
    if item is None:
        return error_page(request, 404, NO_MESSAGE)
    if is_htmx(request):
        return app.templates.response("_edit_form.html", chat=chat, item=item, edit_draft=None)
    response: Response = app.chat_page(context, editing=run_id)
    return response


async def edit(request: Request) -> Response:
    """POST /chats/{chat_id}/messages/{run_id}/edit: rewind to before it, run the new text."""
    app = web(request)
    chat = await load_chat(request)
    if chat is None:
        return await refuse(request, 404, NO_CHAT)
    run_id = request.path_params["run_id"]
    try:
        form = await read_message(request, app.max_message_chars)
    except FormError as exc:
        return await refuse(
            request, exc.status, exc.message, chat=chat, draft=exc.draft, editing=run_id
        )
    async with app.runs.lock(chat.id):
        status = await _rewind_and_start(app, chat, run_id, form.text)
    if status == 409:
        return await refuse(request, 409, BUSY, chat=chat, draft=form.text, editing=run_id)
    if status == 404:
        return await refuse(request, 404, NO_MESSAGE, chat=chat)
    return await chat_update(request, chat.id)


async def regenerate(request: Request) -> Response:
    """POST /chats/{chat_id}/regenerate: run the last reply's message again."""
    app = web(request)
    chat = await load_chat(request)
    if chat is None:
        return await refuse(request, 404, NO_CHAT)
    async with app.runs.lock(chat.id):
        segments = await app.session.segments(chat.id)
        last = segments[-1] if segments else None
        if last is None or not last.entries or not isinstance(last.entries[0], UserEntry):
            status = 400
        else:
            status = await _rewind_and_start(app, chat, last.run_id, last.entries[0].text)
    if status == 409:
        return await refuse(request, 409, BUSY, chat=chat)
    if status in (400, 404):
        return await refuse(request, 400, NOTHING_TO_REGENERATE, chat=chat)
    return await chat_update(request, chat.id)


async def _rewind_and_start(app: WebApp, chat: Chat, run_id: str, text: str) -> int:
    """SPEC §6 flows 3 and 4 (chat lock held): 200, or the status to refuse with."""
    await app.runs.settle(chat.id)
    current = await app.chats.get(chat.id)
    if current is None:
        return 404
    if current.active_run_id:
        return 409
    segments = await app.session.segments(chat.id)
    found = _find_input(segments, run_id)
    if found is None:
        return 404
    keep, segment = found
    undone = [s.run_id for s in segments[segments.index(segment) :]]
    rewind = getattr(app.session, "rewind", None)
    if rewind is None:
        raise TypeError(f"{type(app.session).__name__} has no rewind(); use a built-in store")
    await rewind(chat.id, keep_entries=keep)
    await app.runs.discard(chat.id, undone)  # or a resume would write the undone tail back
    first = segment.entries[0]
    if keep == 0 and isinstance(first, UserEntry) and current.title == title_from_text(first.text):
        # The first message was edited and the title was made from it: follow the edit.
        await app.chats.rename(chat.id, title_from_text(text))
    await app.runs.start(chat.id, text)
    return 200


async def stop(request: Request) -> Response:
    """POST /chats/{chat_id}/runs/{run_id}/stop: stop and keep what was produced."""
    app = web(request)
    chat = await load_chat(request)
    if chat is None:
        return await refuse(request, 404, NO_CHAT)
    run_id = request.path_params["run_id"]
    state = await app.runs.stop(chat.id, run_id)
    if state is not None:
        html = app.live_reply_html(state)
    else:
        found = await app.stored_reply_html(chat.id, run_id)
        if found is None:
            return await refuse(request, 404, "There is no such run in this chat.", chat=chat)
        html = found
    if is_htmx(request):
        return HTMLResponse(html)
    return RedirectResponse(request.url_for("chat", chat_id=chat.id), status_code=303)
