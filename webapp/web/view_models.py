"""Transcript -> view model: what the templates draw for each message.

A stored segment is one run: its first entry is the user's message (the run's
input) and the rest is the reply. The reply's text from several model turns
is shown as one text block (turns joined by a blank line), with tool cards
and reasoning above it, so a reply always has exactly one ``.content``
element -- the live stream and the stored transcript render the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Union

from webapp.chats.tree import PathVersions, Versions
from webapp.stores.session import Segment
from webapp.transcript import Attachment
from webapp.web.live.reply import (
    TURN_SEPARATOR,
    CardApproval,
    ReplyStatus,
    ReplyView,
    ToolCard,
    annotate,
    reply_from_entries,
    shown_images,
    split_run,
    tool_dom_id,
)
from webapp.web.markdown import render_markdown

# The reply record lives with the live runs that grow it (webapp.web.live.reply);
# the web's code and templates keep reaching it here.
__all__ = [
    "TURN_SEPARATOR",
    "CardApproval",
    "ChatItem",
    "ReplyStatus",
    "ReplyView",
    "ToolCard",
    "UserView",
    "annotate",
    "items_from_segments",
    "render_replies",
    "reply_from_entries",
    "shown_images",
    "split_run",
    "status_from_meta",
    "title_from_text",
    "tool_dom_id",
]


@dataclass(frozen=True)
class UserView:
    run_id: str  # the run whose input this message is: the Edit key
    text: str
    versions: Versions | None = None  # set when the message has more than one version
    attachments: tuple[Attachment, ...] = ()  # the files it brought (SPEC §14)
    kind = "user"


ChatItem = Union[UserView, ReplyView]


async def render_replies(items: Iterable[object]) -> None:
    """Draw the Markdown of every finished reply among ``items`` (`ReplyView.html`) in
    a worker thread: Markdown costs time with the text's length and shape (a second
    for 100,000 characters of some), and on the event loop that second would stall
    every other request. A reply streaming has no Markdown yet, only text."""
    replies = [
        i for i in items if isinstance(i, ReplyView) and i.status != "streaming" and i.html is None
    ]
    if not replies:
        return
    drawn = await asyncio.to_thread(lambda: [render_markdown(r.text) for r in replies])
    for reply, html in zip(replies, drawn):
        reply.html = html


def status_from_meta(meta: dict[str, Any] | None) -> ReplyStatus:
    """The web app records stopped and failed runs in the segment's meta."""
    status = (meta or {}).get("status")
    if status in ("stopped", "failed"):
        return "stopped" if status == "stopped" else "failed"
    return "completed"


def items_from_segments(
    segments: list[Segment], versions: PathVersions | None = None
) -> list[ChatItem]:
    """Every message of a chat, in order, from its stored segments (the shown path),
    with each one's versions where it has more than one."""
    items: list[ChatItem] = []
    for seg in segments:
        user, rest = split_run(seg.entries)
        if user is not None:
            message = versions.of_message(seg.run_id) if versions else None
            items.append(UserView(seg.run_id, user.text, message, user.attachments))
        status = status_from_meta(seg.meta)
        if rest or status != "completed" or user is not None:
            reply = reply_from_entries(seg.run_id, rest, status, meta=seg.meta)
            if versions is not None:
                annotate(reply, versions)
            items.append(reply)
    replies = [i for i in items if isinstance(i, ReplyView)]
    for reply in replies[:-1]:
        reply.last = False
    return items


def title_from_text(text: str, limit: int = 60) -> str:
    """A chat title from its first message: one line, at most ``limit`` characters."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line or "New chat"
    return line[: limit - 1].rstrip() + "…"
