"""Transcript -> view model: what the templates draw for each message.

A stored segment is one run: its first entry is the user's message (the run's
input) and the rest is the reply. The reply's text from several model turns
is shown as one text block (turns joined by a blank line), with tool cards
and reasoning above it, so a reply always has exactly one ``.content``
element -- the live stream and the stored transcript render the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from markupsafe import Markup

from webapp.chats.tree import PathVersions, Versions
from webapp.stores.session import Segment
from webapp.transcript import (
    AssistantEntry,
    Attachment,
    Entry,
    ReasoningEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
)
from webapp.usage import Usage
from webapp.web.markdown import render_markdown

# "waiting": the run paused for a tool approval (SPEC §11); nothing runs until a decision.
ReplyStatus = Literal["streaming", "waiting", "completed", "stopped", "failed"]
TURN_SEPARATOR = "\n\n"
# What a tool card shows of an approval: the call waits for the user, or was decided.
CardApproval = Literal["waiting", "allowed", "denied"]
# Images a tool result may show: data: URLs of these types only, base64 and nothing else,
# so a result can never make the page load an address or run a script.
_SHOWN_IMAGE = re.compile(r"data:image/(?:png|jpeg|gif|webp);base64,[A-Za-z0-9+/]+={0,2}")


@dataclass
class ToolCard:
    call_id: str
    name: str
    arguments: str
    output: str | None = None  # None while the tool is still running
    is_error: bool = False
    images: tuple[str, ...] = ()  # data: URLs the result returned (`shown_images`)
    approval: CardApproval | None = None  # None: the call never asked for one
    may_have_run: bool = False  # waiting again after a crash cut the call short

    def __post_init__(self) -> None:
        self.images = tuple(self.images)  # a list when read back from JSON

    @property
    def dom_id(self) -> str:
        return tool_dom_id(self.call_id)

    @property
    def pretty_arguments(self) -> str:
        """Arguments as indented JSON when they parse, else exactly as sent."""
        try:
            value = json.loads(self.arguments) if self.arguments.strip() else {}
        except json.JSONDecodeError:
            return self.arguments
        return json.dumps(value, ensure_ascii=False, indent=2)


@dataclass
class ReplyView:
    """One assistant reply; mutable so a live run can grow it event by event."""

    run_id: str
    status: ReplyStatus = "streaming"
    text: str = ""
    reasoning: str = ""
    tools: list[ToolCard] = field(default_factory=list)
    error: str | None = None
    live_run_id: str | None = None  # the run streaming into it, when that is a continuation
    cut_short: bool = False  # the model stopped at its output limit (finish_reason "length")
    # It failed while the model was writing its text (the endpoint's stream was cut,
    # say): the text shown is unfinished, and goes on as a stopped reply's would.
    cut_off: bool = False
    versions: Versions | None = None  # set when the reply has more than one version
    last: bool = True  # the last reply on the page: the only one that can be continued
    model: str | None = None  # the endpoint/model that wrote it, when recorded
    usage: Usage | None = None  # as the endpoint reported it; None: it reported none
    html: Markup | None = None  # ``text`` as Markdown, when `render_replies` drew it
    kind = "assistant"  # for templates: which partial draws this item

    @property
    def stream_run_id(self) -> str:
        """The run whose events and Stop this reply's element uses."""
        return self.live_run_id or self.run_id

    @property
    def other_models(self) -> list[str]:
        """The models that wrote this reply's other versions, where they differ from its own."""
        models = self.versions.models if self.versions is not None else ()
        return sorted({m for m in models if m and m != self.model})

    @property
    def can_continue(self) -> bool:
        cut = (
            self.status == "stopped"
            or (self.status == "completed" and self.cut_short)
            or (self.status == "failed" and self.cut_off)
        )
        return cut and self.last

    def add_text(self, text: str, *, new_turn: bool) -> str:
        """Append streamed text; returns what was appended (with a turn break)."""
        if new_turn and self.text:
            text = TURN_SEPARATOR + text
        self.text += text
        self.html = None  # drawn from the text before this
        return text

    def add_reasoning(self, text: str, *, new_turn: bool) -> str:
        if new_turn and self.reasoning:
            text = TURN_SEPARATOR + text
        self.reasoning += text
        return text

    def start_tool(self, call: ToolCallEntry) -> ToolCard:
        found = self.find_tool(call.call_id)
        if found is not None:
            return found
        card = ToolCard(call.call_id, call.name, call.arguments)
        self.tools.append(card)
        return card

    def finish_tool(self, result: ToolResultEntry) -> ToolCard:
        card = self.find_tool(result.call_id)
        if card is None:  # a result without its call (not expected): still show it
            card = ToolCard(result.call_id, "tool", "")
            self.tools.append(card)
        card.output, card.is_error = result.output, result.is_error
        card.images = shown_images(result.images)
        return card

    def mark_approvals(
        self, decisions: Mapping[str, str], waiting: Mapping[str, bool] | None = None
    ) -> None:
        """Say on each card what the user decided (``decisions``: call_id -> "allow" |
        "always" | "deny") and which calls still wait (``waiting``: call_id -> may have
        run). A decision wins: the run resumes with it (a spent one is deleted first)."""
        for card in self.tools:
            if card.call_id in decisions:
                card.approval = "denied" if decisions[card.call_id] == "deny" else "allowed"
                card.may_have_run = False
            elif waiting is not None and card.call_id in waiting:
                card.approval, card.may_have_run = "waiting", waiting[card.call_id]

    def find_tool(self, call_id: str) -> ToolCard | None:
        return next((c for c in self.tools if c.call_id == call_id), None)


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


def annotate(reply: ReplyView, versions: PathVersions) -> None:
    """The reply's switcher, model and usage, from its run's node in the tree."""
    reply.versions = versions.of_reply(reply.run_id)
    node = versions.nodes.get(reply.run_id)
    if node is not None:
        reply.model, reply.usage = node.model, node.usage


def shown_images(images: Iterable[str]) -> tuple[str, ...]:
    """The images a card may show: `_SHOWN_IMAGE` data: URLs; anything else is left out."""
    return tuple(i for i in images if _SHOWN_IMAGE.fullmatch(i))


def tool_dom_id(call_id: str) -> str:
    """An HTML id for a tool card; call ids come from models, so never used raw."""
    return "tool-" + hashlib.sha1(call_id.encode("utf-8")).hexdigest()[:16]


def reply_from_entries(
    run_id: str, entries: list[Entry], status: ReplyStatus, *, meta: dict[str, Any] | None = None
) -> ReplyView:
    """A reply from a run's produced entries (its input excluded); ``meta`` is the
    segment's (status, error and finish reason as the web app records them)."""
    error = None
    if status == "failed":
        found = (meta or {}).get("error")
        error = str(found) if found else "The run failed."
    reply = ReplyView(run_id, status, error=error)
    reply.cut_short = (meta or {}).get("finish_reason") == "length"
    texts, reasonings = [], []
    for entry in entries:
        if isinstance(entry, AssistantEntry) and entry.text:
            texts.append(entry.text)
        elif isinstance(entry, ReasoningEntry) and entry.text:
            reasonings.append(entry.text)
        elif isinstance(entry, ToolCallEntry):
            reply.start_tool(entry)
        elif isinstance(entry, ToolResultEntry):
            reply.finish_tool(entry)
    reply.text = TURN_SEPARATOR.join(texts)
    reply.reasoning = TURN_SEPARATOR.join(reasonings)
    last = entries[-1] if entries else None
    reply.cut_off = status == "failed" and isinstance(last, AssistantEntry) and bool(last.text)
    return reply


def split_run(entries: list[Entry]) -> tuple[UserEntry | None, list[Entry]]:
    """A run's input message and the rest."""
    if entries and isinstance(entries[0], UserEntry):
        return entries[0], list(entries[1:])
    return None, list(entries)


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
