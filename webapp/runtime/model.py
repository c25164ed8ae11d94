"""The Model protocol: what the run loop needs from any model adapter.

A model call takes a ModelRequest and yields parts as they stream. Tool calls
are yielded whole (an adapter assembles provider deltas itself), so the run
loop never sees half a call. Adapters live in `webapp.models`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, Union, runtime_checkable

from webapp.transcript import Entry
from webapp.usage import Usage


@dataclass(frozen=True)
class ToolSpec:
    """What a model is told about one tool."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object


@dataclass(frozen=True)
class ModelRequest:
    """One model call.

    With `continue_final` the entries end with an unfinished assistant reply
    and the model is to write what comes next, as text that is appended to it
    directly (no repetition, no preamble). The runner sets it only then.
    """

    system: str
    entries: list[Entry]  # tool-consistent, system prompt excluded
    tools: list[ToolSpec] = field(default_factory=list)
    continue_final: bool = False


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ReasoningPart:
    text: str


@dataclass(frozen=True)
class ToolCallPart:
    call_id: str
    name: str
    arguments: str  # JSON text as the model sent it


@dataclass(frozen=True)
class UsagePart:
    usage: Usage


@dataclass(frozen=True)
class FinishPart:
    reason: str | None  # "stop", "tool_calls", "length", ... as the provider said


ModelPart = Union[TextPart, ReasoningPart, ToolCallPart, UsagePart, FinishPart]


@runtime_checkable
class Model(Protocol):
    """Streams one model turn. Errors are raised from the iterator."""

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]: ...
