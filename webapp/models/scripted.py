"""ScriptedModel: a model that plays a fixed script, for tests.

Each turn is a string (streamed word by word), a list of
``(tool_name, arguments_dict)`` tuples (tool calls with generated unique
ids), or an exception instance (raised by that call). A `CutOff(text)` turn
streams its text and ends with finish_reason "length", as a model does at its
output limit. ``requests`` records the entries each call received, system
prompt excluded, and ``continued`` whether the call was asked to continue the
final assistant reply (`ModelRequest.continue_final`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Union

from webapp.runtime.model import (
    FinishPart,
    ModelPart,
    ModelRequest,
    TextPart,
    ToolCallPart,
    UsagePart,
)
from webapp.transcript import Entry
from webapp.usage import Usage


@dataclass(frozen=True)
class CutOff:
    """A text turn that stops at the output limit (finish_reason "length")."""

    text: str


ScriptedTurn = Union[str, CutOff, Sequence[tuple[str, dict[str, Any]]], BaseException]

_ids = itertools.count(1)


class ScriptedModel:
    def __init__(self, turns: Sequence[ScriptedTurn], *, chunk_delay: float = 0.0) -> None:
        self.turns = list(turns)
        self.chunk_delay = chunk_delay
        self.requests: list[list[Entry]] = []
        self.systems: list[str] = []
        self.tools: list[list[str]] = []
        self.continued: list[bool] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        index = len(self.requests)
        self.requests.append(list(request.entries))
        self.systems.append(request.system)
        self.tools.append([t.name for t in request.tools])
        self.continued.append(request.continue_final)
        if index >= len(self.turns):
            raise RuntimeError(
                f"ScriptedModel ran out of turns: call {index + 1} but only "
                f"{len(self.turns)} scripted"
            )
        turn = self.turns[index]
        input_tokens = sum(len(str(e)) for e in request.entries) // 4
        if isinstance(turn, BaseException):
            raise turn
        if isinstance(turn, (str, CutOff)):
            text = turn.text if isinstance(turn, CutOff) else turn
            words = re.findall(r"\S+\s*|\s+", text)
            for word in words:
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                yield TextPart(word)
            yield UsagePart(Usage(input_tokens, len(words)))
            yield FinishPart("length" if isinstance(turn, CutOff) else "stop")
            return
        for name, arguments in turn:
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            yield ToolCallPart(f"call_s{next(_ids)}", name, json.dumps(arguments))
        yield UsagePart(Usage(input_tokens, len(turn)))
        yield FinishPart("tool_calls")
