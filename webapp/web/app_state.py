"""What every view needs: the stores, the run manager, the templates and the limits.

`WebApp` also holds the rendering that several views (and the SSE endpoint)
share, so a reply or a chat page is drawn by exactly one function.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from markupsafe import escape
from starlette.requests import Request

from webapp.stores.checkpoint import Checkpointer
from webapp.stores.session import Session
from webapp.web.chats import Chat, ChatStore
from webapp.web.render import (
    ChatItem,
    ReplyView,
    ToolCard,
    UserView,
    items_from_segments,
)
from webapp.web.runs import Fragments, RunManager, RunState
from webapp.web.templating import Templates


@dataclass
class WebApp:
    templates: Templates
    chats: ChatStore
    session: Session
    checkpointer: Checkpointer
    runs: RunManager
    max_message_chars: int
    model_description: str

    # --- fragments ------------------------------------------------------------------

    def reply_html(self, chat_id: str, reply: ReplyView, position: str | None = None) -> str:
        return self.templates.render("_reply.html", chat_id=chat_id, reply=reply, position=position)

    def regenerate_html(self, chat_id: str, show: bool, oob: bool) -> str:
        return self.templates.render("_regenerate.html", chat_id=chat_id, show=show, oob=oob)

    def final_reply_html(self, chat_id: str, reply: ReplyView, last: bool = True) -> str:
        """The finished reply plus, out of band, the Regenerate button under it and an
        empty alert (a "still running" refusal is stale once the run has ended)."""
        alert = self.templates.render("_alert.html", alert="", oob=True)
        return self.reply_html(chat_id, reply) + self.regenerate_html(chat_id, last, True) + alert

    def live_reply_html(self, state: RunState) -> str:
        """A run's reply as it is now: streaming from the current position, or final."""
        if state.finished:
            return self.final_reply_html(state.chat_id, state.reply, not state.abandoned)
        return self.reply_html(state.chat_id, state.reply, state.position)

    def tool_card_html(self, card: ToolCard, oob: bool) -> str:
        return self.templates.render("_tool_card.html", card=card, oob=oob)

    def fragments(self) -> Fragments:
        return Fragments(
            text=lambda text: f"<span>{escape(text)}</span>",
            tool_card=self.tool_card_html,
            final_reply=self.final_reply_html,
        )

    async def stored_reply_html(self, chat_id: str, run_id: str) -> str | None:
        """The stored reply of one run as a final fragment, or None if there is none."""
        segments = await self.session.segments(chat_id)
        items = items_from_segments(segments)
        replies = [i for i in items if isinstance(i, ReplyView)]
        for reply in replies:
            if reply.run_id == run_id:
                chat = await self.chats.get(chat_id)
                last = reply is replies[-1] and chat is not None and not chat.active_run_id
                return self.final_reply_html(chat_id, reply, last)
        return None

    # --- the chat page ---------------------------------------------------------------

    async def chat_items(self, chat: Chat) -> tuple[list[ChatItem], RunState | None]:
        """Stored messages plus the live run (if any) not yet stored."""
        segments = await self.session.segments(chat.id)
        items = items_from_segments(segments)
        stored = {s.run_id for s in segments}
        live = self.runs.latest(chat.id)
        if live is None or live.run_id in stored or live.abandoned:
            return items, None
        if live.finished and chat.active_run_id != live.run_id:
            return items, None
        items.append(UserView(live.run_id, live.input_text))
        return items, live

    async def page_context(self, chat: Chat | None) -> dict[str, Any]:
        """Everything base.html and chat.html need, except the per-request extras."""
        chats = await self.chats.recent()
        items: list[ChatItem] = []
        live: RunState | None = None
        if chat is not None:
            items, live = await self.chat_items(chat)
        return {
            "chat": chat,
            "chats": chats,
            "items": items,
            "live": live,
            "client_id": new_client_id(),
            "max_message_chars": self.max_message_chars,
            "model_description": self.model_description,
        }

    def chat_page(
        self,
        context: dict[str, Any],
        *,
        status_code: int = 200,
        alert: str = "",
        draft: str = "",
        editing: str | None = None,
        edit_draft: str | None = None,
    ) -> Any:
        """Render chat.html; the live reply is drawn at the position read here."""
        live: RunState | None = context["live"]
        chat: Chat | None = context["chat"]
        can_regenerate = (
            chat is not None
            and live is None
            and not chat.active_run_id
            and any(isinstance(i, ReplyView) for i in context["items"])
        )
        # No await between reading the live reply and its position: they match.
        position = live.position if live is not None and not live.finished else None
        return self.templates.response(
            "chat.html",
            status_code=status_code,
            alert=alert,
            draft=draft,
            editing=editing,
            edit_draft=edit_draft,
            position=position,
            can_regenerate=can_regenerate,
            **context,
        )


def web(request: Request) -> WebApp:
    found = getattr(request.app.state, "web", None)
    if not isinstance(found, WebApp):
        raise TypeError(
            "request.app.state.web is missing: build the app with webapp.web.create_app"
        )
    return found


def new_client_id() -> str:
    """A fresh id for the next message a form sends (the idempotency key of a send)."""
    return uuid.uuid4().hex
