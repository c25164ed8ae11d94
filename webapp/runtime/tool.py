"""`@tool`: a plain function becomes a tool the model can call.

The JSON schema comes from the parameters' annotations and the docstring
(first paragraph = description, a Google-style ``Args:`` section = parameter
descriptions). A first parameter annotated `RunContext` receives the run's
context and is hidden from the model.

A plain (synchronous) function runs in a worker thread, so a slow one --
reading a large file, a blocking HTTP call -- holds up its own run only,
never the event loop every other stream and request shares. A coroutine
function runs on the loop, as async code expects.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from webapp.runtime.model import ToolSpec
from webapp.transcript import ToolCallEntry, ToolResultEntry
from webapp.usage import Usage

Approval = Literal["allow", "ask"]
APPROVALS = ("allow", "ask")


@dataclass
class RunContext:
    """What a tool, hook or callable instruction sees of the run."""

    run_id: str
    session_id: str | None
    turn: int = 0
    context: Any = None
    agent_name: str = ""
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any]
    takes_context: bool = False
    approval: Approval = "allow"
    rerunnable: bool = True  # the seed's at-least-once default: a dangling call runs again

    def __post_init__(self) -> None:
        if self.approval not in APPROVALS:
            raise ValueError(f"tool {self.name!r}: approval must be one of {APPROVALS}")

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    async def invoke(self, ctx: RunContext, call: ToolCallEntry) -> ToolResultEntry:
        """Run the tool; any exception becomes an error result the model can read."""
        try:
            kwargs = _parse_arguments(call.arguments)
            args = (ctx,) if self.takes_context else ()
            if inspect.iscoroutinefunction(self.function):
                value = await self.function(*args, **kwargs)
            else:  # blocking code: off the event loop
                value = await asyncio.to_thread(self.function, *args, **kwargs)
                if inspect.isawaitable(value):  # a plain callable that returned a coroutine
                    value = await value
        except Exception as exc:  # noqa: BLE001 -- the model sees the failure; the run goes on
            message = str(exc) or type(exc).__name__
            return ToolResultEntry(call.call_id, f"{type(exc).__name__}: {message}", True)
        return ToolResultEntry(call.call_id, _to_text(value))


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    approval: Approval = "allow",
    rerunnable: bool = True,
) -> Any:
    """Decorator (bare or with ``name=``, ``approval=``, ``rerunnable=``) turning a
    function into a `Tool`."""

    def wrap(fn: Callable[..., Any]) -> Tool:
        built = _build_tool(fn, name or fn.__name__)
        return replace(built, approval=approval, rerunnable=rerunnable)

    return wrap(function) if function is not None else wrap


def _parse_arguments(arguments: str) -> dict[str, Any]:
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise ValueError(f"tool arguments are not valid JSON ({exc.msg}): {arguments[:200]!r}")
    if not isinstance(value, dict):
        raise TypeError(f"tool arguments must be a JSON object, got {arguments[:200]!r}")
    return value


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _build_tool(fn: Callable[..., Any], name: str) -> Tool:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'")
    hints = get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    takes_context = bool(params) and hints.get(params[0].name) is RunContext
    if takes_context:
        params = params[1:]
    summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(f"tool {name!r}: *args/**kwargs cannot be described to a model")
        schema = _schema_for(hints.get(p.name, str))
        if p.name in arg_docs:
            schema["description"] = arg_docs[p.name]
        properties[p.name] = schema
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return Tool(name, summary or name, parameters, fn, takes_context)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    summary = doc.split("\n\n", 1)[0].strip().replace("\n", " ")
    args: dict[str, str] = {}
    match = re.search(
        r"^(?:Args|Arguments|Parameters):\s*\n(.*?)(?:\n\s*\n|\Z)", doc, re.DOTALL | re.MULTILINE
    )
    if match:
        current = None
        for line in match.group(1).splitlines():
            item = re.match(r"\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line)
            if item:
                current = item.group(1)
                args[current] = item.group(2).strip()
            elif current and line.strip():
                args[current] += " " + line.strip()
    return summary, args


_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema_for(annotation: Any) -> dict[str, Any]:
    if annotation in _SIMPLE:
        return {"type": _SIMPLE[annotation]}
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return (
            _schema_for(options[0])
            if len(options) == 1
            else {"anyOf": [_schema_for(a) for a in options]}
        )
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple):
        return {"type": "array", "items": _schema_for(args[0])} if args else {"type": "array"}
    if origin is dict or annotation is dict:
        return {"type": "object"}
    return {}
