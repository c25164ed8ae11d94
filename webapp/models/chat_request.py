"""What a Chat Completions request says: messages, tools, and continuing a reply.

`build_messages` turns a transcript into ``messages``; `tool_definition` a
ToolSpec into a ``tools`` item. Continuing an unfinished assistant reply can
be asked of an endpoint in two ways, and endpoints differ in which they accept:

- **prefill**: the partial reply is the last message and the server goes on
  writing it, token by token, as if it had never stopped. vLLM does this with
  ``continue_final_message: true`` plus ``add_generation_prompt: false``;
  llama.cpp's server prefills from a final assistant message by itself and
  ignores fields it does not know. Seamless: the model sees no instruction.
- **ask**: keep the partial reply and add a user message asking the model to
  go on. Every endpoint accepts it, but the model only *tries* not to repeat
  itself or add a preamble.

OpenAI refuses the prefill fields (HTTP 400, unrecognized argument), so the
default mode "auto" sends prefill first and, when that is refused, asks.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from webapp.models.attached import user_content
from webapp.runtime.model import ToolSpec
from webapp.transcript import (
    AssistantEntry,
    Entry,
    ReasoningEntry,
    ToolCallEntry,
    UserEntry,
    drop_dangling_tool_calls,
)


def build_messages(system: str, entries: list[Entry]) -> list[dict[str, Any]]:
    """The Chat Completions ``messages`` for a system prompt and a transcript.

    The transcript is made tool-consistent first: a call without a result, or
    a result without its call, makes OpenAI-style servers reject the request.
    Reasoning is not sent back (providers either ignore or refuse it).
    """
    entries = drop_dangling_tool_calls(entries)
    called = {e.call_id for e in entries if isinstance(e, ToolCallEntry)}
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    turn: dict[str, Any] | None = None  # the assistant message being assembled
    for entry in entries:
        if isinstance(entry, ReasoningEntry):
            continue
        if isinstance(entry, (AssistantEntry, ToolCallEntry)):
            if turn is None or (isinstance(entry, AssistantEntry) and "tool_calls" in turn):
                turn = {"role": "assistant", "content": None}
                messages.append(turn)
            if isinstance(entry, AssistantEntry):
                turn["content"] = (turn["content"] or "") + entry.text
            else:
                turn.setdefault("tool_calls", []).append(_tool_call_message(entry))
            continue
        turn = None
        if isinstance(entry, UserEntry):
            messages.append({"role": "user", "content": user_content(entry)})
        elif entry.call_id in called:
            messages.append(
                {"role": "tool", "tool_call_id": entry.call_id, "content": entry.output}
            )
    return messages


def _tool_call_message(entry: ToolCallEntry) -> dict[str, Any]:
    return {
        "id": entry.call_id,
        "type": "function",
        "function": {"name": entry.name, "arguments": entry.arguments or "{}"},
    }


def tool_definition(spec: ToolSpec) -> dict[str, Any]:
    """A ToolSpec in the Chat Completions ``tools`` format."""
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


Continuation = Literal["auto", "prefill", "ask"]
CONTINUATION_MODES: tuple[Continuation, ...] = ("auto", "prefill", "ask")

# A server that does not know a field answers 400 (OpenAI, vLLM) or, if it
# validates with a schema library, 422.
PREFILL_REFUSED = frozenset({400, 422})

CONTINUE_INSTRUCTION = (
    "Continue your last reply exactly where it stopped. Do not repeat what you "
    "already wrote, and do not add any preamble: your answer is appended to it as is."
)


def check_continuation(mode: object) -> Continuation:
    if mode not in CONTINUATION_MODES:
        raise ValueError(
            f"continuation must be one of {', '.join(map(repr, CONTINUATION_MODES))}, got {mode!r}"
        )
    return cast(Continuation, mode)


def ends_with_partial_reply(messages: list[dict[str, Any]]) -> bool:
    """Whether the last message is assistant text that can be continued."""
    if not messages:
        return False
    last = messages[-1]
    return (
        last.get("role") == "assistant" and bool(last.get("content")) and not last.get("tool_calls")
    )


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """`body` asking the server to extend its final assistant message."""
    return {**body, "continue_final_message": True, "add_generation_prompt": False}


def ask_body(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with a final user message asking the model to go on."""
    instruction = {"role": "user", "content": CONTINUE_INSTRUCTION}
    return {**body, "messages": [*body["messages"], instruction]}
