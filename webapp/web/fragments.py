"""The HTML fragments a run's events carry and a few endpoints answer with.

One function draws each fragment, whoever sends it: the run's own task (once
per event, shared by every client), the Stop endpoint and the SSE endpoint's
final or reset event. Streamed text is escaped text, never a template.
"""

from __future__ import annotations

import re

from markupsafe import escape

from webapp.web.templating import Templates
from webapp.web.view_models import ReplyView, ToolCard, render_replies

_NEEDS_ESCAPE = re.compile(r"[&<>\"']")  # exactly what markupsafe.escape replaces


class Fragments:
    def __init__(self, templates: Templates) -> None:
        self.templates = templates

    @staticmethod
    def text(text: str) -> str:
        # One per streamed token: most tokens have nothing to escape, and the
        # search is much cheaper than building a Markup for them.
        if _NEEDS_ESCAPE.search(text) is not None:
            text = str(escape(text))
        return "<span>" + text + "</span>"

    def tool_card(self, card: ToolCard, oob: bool) -> str:
        return self.templates.render("_tool_card.html", card=card, oob=oob)

    def reply(self, chat_id: str, reply: ReplyView, position: str | None = None) -> str:
        """A reply element; with ``position`` it streams from there."""
        return self.templates.render("_reply.html", chat_id=chat_id, reply=reply, position=position)

    @staticmethod
    async def draw(replies: list[ReplyView]) -> None:
        """The finished replies' Markdown, in a worker thread (`render_replies`)."""
        await render_replies(replies)

    def final_reply(self, chat_id: str, reply: ReplyView) -> str:
        """The finished reply plus, out of band, an empty alert (a "still running"
        refusal is stale once the run has ended) and a fetch of the chat's new total."""
        alert = self.templates.render("_alert.html", alert="", oob=True)
        total = self.templates.render("_chat_usage.html", chat_id=chat_id, refresh=True)
        return self.reply(chat_id, reply) + alert + total
