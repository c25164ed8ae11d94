"""ScriptedModel: a model that plays a fixed script, for tests.

Each turn is a string (streamed word by word), a list of
``(tool_name, arguments_dict)`` tuples (tool calls with generated unique
ids), or an exception instance (raised by that call). ``requests`` records
the entries each call received, system prompt excluded.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import AsyncIterator, Sequence
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

ScriptedTurn = Union[str, Sequence[tuple[str, dict[str, Any]]], BaseException]

_ids = itertools.count(1)


class ScriptedModel:
    def __init__(self, turns: Sequence[ScriptedTurn], *, chunk_delay: float = 0.0) -> None:
        self.turns = list(turns)
        self.chunk_delay = chunk_delay
        self.requests: list[list[Entry]] = []
        self.systems: list[str] = []
        self.tools: list[list[str]] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        index = len(self.requests)
        self.requests.append(list(request.entries))
        self.systems.append(request.system)
        self.tools.append([t.name for t in request.tools])
        if index >= len(self.turns):
            raise RuntimeError(
                f"ScriptedModel ran out of turns: call {index + 1} but only "
                f"{len(self.turns)} scripted"
            )
        turn = self.turns[index]
        input_tokens = sum(len(str(e)) for e in request.entries) // 4
        if isinstance(turn, BaseException):
            raise turn
        if isinstance(turn, str):
            words = re.findall(r"\S+\s*|\s+", turn)
            for word in words:
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                yield TextPart(word)
            yield UsagePart(Usage(input_tokens, len(words)))
            yield FinishPart("stop")
            return
        for name, arguments in turn:
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            yield ToolCallPart(f"call_s{next(_ids)}", name, json.dumps(arguments))
        yield UsagePart(Usage(input_tokens, len(turn)))
        yield FinishPart("tool_calls")
