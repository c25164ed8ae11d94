"""OpenAI's Chat Completions wire format, both ways (SPEC §16).

`parse_request` turns a request body into an `ApiRequest` or raises `ApiError`
with the status and code OpenAI would use; the other functions build the JSON
a client expects from a run's plain record (`webapp.web.live.reply.ReplyView`):
a completion, its stream's chunks, an error. Nothing here touches a run.

Stream positions: each chunk's SSE id counts what the client has, so a resumed
stream (``Last-Event-ID: N``) sends exactly what comes after: a content chunk's
id is the number of characters of content sent with it and before it; the
chunks after the content (the tool calls, the finish, the usage) are numbered
on from the content's length.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from webapp.transcript import AssistantEntry, Entry, ToolCallEntry, ToolResultEntry, UserEntry
from webapp.usage import Usage
from webapp.web.live.reply import ReplyView

MAX_BODY_BYTES = 4 * 1024 * 1024
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,254}")
_ROLES = ("system", "developer", "user", "assistant", "tool")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128


class ApiError(Exception):
    """A refusal in OpenAI's shape: ``{"error": {"message", "type", "code"}}``."""

    def __init__(self, status: int, message: str, code: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.kind = kind or _KINDS.get(status, "api_error")

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "code": self.code}}


_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


@dataclass(frozen=True)
class ApiRequest:
    model: str
    instructions: str  # the system (and developer) messages, joined
    history: list[list[Entry]]  # the turns before the run's input
    text: str | None  # the last user message, the run's input; None: after tool results
    tools: list[dict[str, Any]]  # the caller's tools ({name, description, parameters})
    stream: bool
    include_usage: bool
    temperature: float | None
    max_tokens: int | None
    store: bool
    body_hash: str  # what an idempotent repeat must match


def invalid(message: str, code: str = "invalid_request") -> ApiError:
    return ApiError(422, message, code)


def parse_request(raw: bytes, max_message_chars: int) -> ApiRequest:
    """The request, or `ApiError` (422) naming what is wrong with it."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise invalid(f"The body is not JSON: {exc}", "invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("The body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required: one of GET /v1/models.", "missing_model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list.", "invalid_messages")
    tools = _tools(body.get("tools"), body.get("tool_choice"))
    instructions, turns = _conversation(messages, max_message_chars)
    if not turns:
        raise invalid("The messages need a user message.", "invalid_messages")
    text: str | None = None
    last = turns[-1][-1]
    if isinstance(last, UserEntry) and len(turns[-1]) == 1:
        turns.pop()
        text = last.text
        if not text.strip():
            raise invalid("The last user message is empty.", "invalid_messages")
    elif not isinstance(last, ToolResultEntry):
        raise invalid("The last message must be the user's, or tool results.", "invalid_messages")
    stream = _flag(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise invalid("'stream_options' must be an object.")
    return ApiRequest(
        model=model,
        instructions=instructions,
        history=turns,
        text=text,
        tools=tools,
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        temperature=_number(body, "temperature", 0.0, 2.0),
        max_tokens=_whole(body, "max_tokens") or _whole(body, "max_completion_tokens"),
        store=_flag(body, "store"),
        body_hash=_body_hash(body),
    )


def _body_hash(body: dict[str, Any]) -> str:
    """What a repeat must match: the body but how it is delivered (streamed or not), so
    a retry may ask for the same answer as a stream, or as one piece."""
    asked = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    return hashlib.sha256(
        json.dumps(asked, sort_keys=True, separators=(",", ":")).encode("utf-8")
    ).hexdigest()


def _conversation(messages: list[Any], limit: int) -> tuple[str, list[list[Entry]]]:
    """System text, and the turns: each a user message and the replies after it."""
    system: list[str] = []
    turns: list[list[Entry]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise invalid(
                f"messages[{index}] needs a 'role' of {', '.join(_ROLES)}.", "invalid_messages"
            )
        role, text = message["role"], _text(message.get("content"), index)
        if len(text) > limit:
            raise invalid(
                f"messages[{index}] is {len(text):,} characters long; the limit is {limit:,}.",
                "message_too_long",
            )
        if role in ("system", "developer"):
            system.append(text)
        elif role == "user":
            turns.append([UserEntry(text)])
        elif role == "assistant" and turns:
            if text:
                turns[-1].append(AssistantEntry(text))
            turns[-1].extend(_tool_calls(message.get("tool_calls"), index))
        elif role == "tool" and turns:
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise invalid(f"messages[{index}] needs its 'tool_call_id'.", "invalid_messages")
            turns[-1].append(ToolResultEntry(call_id, text))
    return "\n\n".join(s for s in system if s), turns


def _tool_calls(calls: Any, index: int) -> list[Entry]:
    if calls is None:
        return []
    found: list[Entry] = []
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(call.get("id"), str):
                break
            arguments = function.get("arguments") or "{}"
            if not isinstance(function.get("name"), str) or not isinstance(arguments, str):
                break
            found.append(ToolCallEntry(call["id"], function["name"], arguments))
        else:
            return found
    raise invalid(f"messages[{index}].tool_calls are not OpenAI's tool calls.", "invalid_messages")


def _tools(tools: Any, choice: Any) -> list[dict[str, Any]]:
    """The caller's function tools; none when ``tool_choice`` is "none"."""
    if tools is None or choice == "none":
        return []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise invalid(f"'tools' must be a list of at most {MAX_TOOLS} tools.", "invalid_tools")
    found = []
    for index, item in enumerate(tools):
        function = item.get("function") if isinstance(item, dict) else None
        if item.get("type") != "function" or not isinstance(function, dict):
            raise invalid(f"tools[{index}] must be a function tool.", "invalid_tools")
        name, parameters = function.get("name"), function.get("parameters") or {}
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise invalid(
                f"tools[{index}] needs a name of 1-64 letters, digits, _ and -.", "invalid_tools"
            )
        if not isinstance(parameters, dict):
            raise invalid(f"tools[{index}].function.parameters must be an object.", "invalid_tools")
        description = function.get("description") or ""
        found.append({"name": name, "description": str(description), "parameters": parameters})
    return found


def _text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):  # content parts: the text ones
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        if all(isinstance(p, str) for p in parts) and all(
            isinstance(p, dict) and p.get("type") == "text" for p in content
        ):
            return "".join(parts)
    raise invalid(f"messages[{index}].content must be text.", "invalid_messages")


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be true or false, got {value!r}.")
    return value


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise invalid(f"'{name}' must be a number from {low} to {high}, got {value!r}.")
    return float(value)


def _whole(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(f"'{name}' must be a whole number of at least 1, got {value!r}.")
    return value


def idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not IDEMPOTENCY_KEY.fullmatch(value):
        raise invalid(
            "Idempotency-Key must be 1 to 255 printable ASCII characters.",
            "invalid_idempotency_key",
        )
    return value


# --- responses ----------------------------------------------------------------------


def completion_id(run_id: str) -> str:
    return f"chatcmpl-{run_id}"


def finish_reason(reply: ReplyView) -> str:
    if reply.status == "waiting":
        return "tool_calls"
    return "length" if reply.cut_short else "stop"


def tool_calls_json(calls: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    return [
        {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls
    ]


def usage_json(usage: Usage | None) -> dict[str, int]:
    tokens_in = usage.input_tokens if usage else 0
    tokens_out = usage.output_tokens if usage else 0
    return {
        "prompt_tokens": tokens_in,
        "completion_tokens": tokens_out,
        "total_tokens": tokens_in + tokens_out,
    }


def completion(
    run_id: str,
    created: int,
    model: str,
    reply: ReplyView,
    calls: list[tuple[str, str, str]] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None}
    if calls:
        message["tool_calls"] = tool_calls_json(calls)
        message["content"] = reply.text or None
    return {
        "id": completion_id(run_id),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if calls else finish_reason(reply),
            }
        ],
        "usage": usage_json(reply.usage),
    }


def chunk(
    run_id: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish: str | None = None,
    usage: Usage | None | bool = False,
) -> dict[str, Any]:
    """One streamed chunk; ``usage`` False: none (the chunks before the last)."""
    found: dict[str, Any] = {
        "id": completion_id(run_id),
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if usage is not False:
        found["choices"] = []
        found["usage"] = usage_json(usage if isinstance(usage, Usage) else None)
    return found


def models_list(names: list[str], created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "webapp"} for n in names
        ],
    }
