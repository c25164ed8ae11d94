"""Reading a Chat Completions response: stream lines, chunks into model parts.

What `webapp.models.openai_chat` gets back from an endpoint, turned into the
runtime's parts without the HTTP around it. Per token this is the hot path:
the common chunk (one choice, a piece of text) takes a fast path, and the
texts of one piece of the body (several events in one HTTP chunk) go on as one
part.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from webapp.errors import ModelError
from webapp.runtime.model import (
    FinishPart,
    ModelPart,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    UsagePart,
)
from webapp.usage import Usage, reported_count

_PLAIN_DELTA = frozenset({"content", "role"})  # a delta that carries only text
MAX_ERROR_TEXT = 500


class SSELines:
    """A byte stream's lines (CR, LF or CRLF), piece by piece: on bytes, since
    httpx's ``aiter_lines`` decodes and re-splits every piece (once per token)
    in three more generator layers, and `json.loads` reads UTF-8 bytes as they
    are. A CRLF split between pieces yields an extra empty line, which SSE ignores."""

    def __init__(self) -> None:
        self._partial: list[bytes] = []  # a line still waiting for its end

    def split(self, piece: bytes) -> list[bytes]:
        if b"\n" not in piece and b"\r" not in piece:
            self._partial.append(piece)
            return []
        if self._partial:
            self._partial.append(piece)
            piece = b"".join(self._partial)
            self._partial.clear()
        lines = piece.splitlines()
        if not piece.endswith((b"\n", b"\r")):
            self._partial.append(lines.pop())
        return lines


@dataclass
class _PendingCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamState:
    """What one streamed completion has said so far, beyond text."""

    calls: list[_PendingCall] = field(default_factory=list)
    by_index: dict[int, _PendingCall] = field(default_factory=dict)
    usage: Usage | None = None
    finish_reason: str | None = None
    done: bool = False

    def feed(self, chunk: dict[str, Any], endpoint: str) -> list[ModelPart]:
        """Absorb one chunk; returns the text and reasoning parts to stream now."""
        # Nearly every chunk is one choice whose delta is a piece of text: take it
        # without the general walk below (this runs once per token).
        choices = chunk.get("choices")
        if type(choices) is list and len(choices) == 1 and chunk.get("usage") is None:
            choice = choices[0]
            delta = choice.get("delta") if type(choice) is dict else None
            if (
                type(delta) is dict
                and delta.keys() <= _PLAIN_DELTA
                and not choice.get("finish_reason")
                and not chunk.get("error")
            ):
                content = delta.get("content")
                if type(content) is str:
                    return [TextPart(content)] if content else []
        if chunk.get("error"):
            message = error_text(chunk["error"])
            raise ModelError(f"{endpoint} reported an error mid-stream: {message}")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage_from(usage)
        parts: list[ModelPart] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                raise ModelError(f"{endpoint} sent a chunk whose choices are not objects")
            delta = choice.get("delta") or {}  # a closing chunk may carry only finish_reason
            if not isinstance(delta, dict):
                raise ModelError(f"{endpoint} sent a chunk whose 'delta' is not an object")
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                parts.append(ReasoningPart(reasoning))
            content = delta.get("content")
            if isinstance(content, str) and content:
                parts.append(TextPart(content))
            for call_delta in delta.get("tool_calls") or []:
                if isinstance(call_delta, dict):
                    self._absorb_call(call_delta)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return parts

    def _absorb_call(self, delta: dict[str, Any]) -> None:
        slot = self._slot_for(delta.get("index"), delta.get("id") or "")
        function = delta.get("function") or {}
        if isinstance(function.get("name"), str) and not slot.name:
            slot.name = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            slot.arguments.append(arguments)
        elif isinstance(arguments, dict):  # a few servers send an object, not JSON text
            slot.arguments.append(json.dumps(arguments))

    def _slot_for(self, index: object, call_id: str) -> _PendingCall:
        known = self.by_index.get(index) if isinstance(index, int) else None
        # Same index with a different id: a server that numbers every call 0.
        if known is not None and not (call_id and known.call_id and call_id != known.call_id):
            if call_id and not known.call_id:
                known.call_id = call_id
            return known
        if index is None and not call_id and self.calls:
            return self.calls[-1]  # a continuation from a server that omits the index
        slot = _PendingCall(call_id=call_id)
        self.calls.append(slot)
        if isinstance(index, int):
            self.by_index[index] = slot
        return slot

    def final_parts(self) -> list[ModelPart]:
        parts: list[ModelPart] = [
            ToolCallPart(
                call.call_id or f"call_{uuid.uuid4().hex[:16]}",
                call.name,
                "".join(call.arguments),
            )
            for call in self.calls
        ]
        if self.usage is not None:
            parts.append(UsagePart(self.usage))
        parts.append(FinishPart(self.finish_reason))
        return parts


def parts_from_completion(body: dict[str, Any]) -> list[ModelPart]:
    state = StreamState()
    if body.get("error"):
        raise ModelError(f"the model endpoint reported an error: {error_text(body['error'])}")
    choices = body.get("choices") or []
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        raise ModelError("the model endpoint answered JSON without choices[0].message")
    parts: list[ModelPart] = []
    if isinstance(message.get("reasoning_content"), str) and message["reasoning_content"]:
        parts.append(ReasoningPart(message["reasoning_content"]))
    if isinstance(message.get("content"), str) and message["content"]:
        parts.append(TextPart(message["content"]))
    for index, call in enumerate(message.get("tool_calls") or []):
        if isinstance(call, dict):
            state._absorb_call({**call, "index": index})
    if isinstance(body.get("usage"), dict):
        state.usage = usage_from(body["usage"])
    state.finish_reason = choices[0].get("finish_reason")
    return parts + state.final_parts()


def usage_from(data: dict[str, Any]) -> Usage:
    """The endpoint's ``usage``: a figure that is not a count below 2^53 is ignored
    (and logged), as none reported (`webapp.usage.reported_count`)."""

    def count(key: str) -> int:
        return reported_count(data.get(key), key) or 0

    return Usage(input_tokens=count("prompt_tokens"), output_tokens=count("completion_tokens"))


def error_text(error: object) -> str:
    if isinstance(error, dict):
        message = error.get("message") or error.get("msg") or error.get("detail")
        if message:
            return str(message)
        return json.dumps(error)[:MAX_ERROR_TEXT]
    return str(error)


def merged(parts: Iterable[ModelPart], into: list[ModelPart] | None = None) -> list[ModelPart]:
    """``parts`` with each run of text (or of reasoning) joined into one part.

    Appended to ``into`` as they come, so that if ``parts`` fails midway what
    came before is there.
    """
    out: list[ModelPart] = [] if into is None else into
    for part in parts:
        kind = type(part)
        if out and kind is type(out[-1]) and kind in (TextPart, ReasoningPart):
            out[-1] = kind(out[-1].text + part.text)  # type: ignore[union-attr, call-arg]
        else:
            out.append(part)
    return out
