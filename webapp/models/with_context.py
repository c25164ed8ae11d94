"""A model whose system prompt is followed, at every call, by context read for that call.

`WithContext` asks its `ExtraContext` source (the chat layer's: a project's
files, SPEC §15) what to add for the request's entries, and sends it after the
system prompt. Read at each call, so a resumed run gets what is there now.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from webapp.runtime.model import Model, ModelPart, ModelRequest
from webapp.transcript import Entry


class ExtraContext(Protocol):
    async def for_request(self, entries: Sequence[Entry]) -> str: ...


@dataclass(frozen=True)
class WithContext:
    model: Model
    context: ExtraContext

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        extra = await self.context.for_request(request.entries)
        if extra:
            system = f"{request.system}\n\n{extra}" if request.system.strip() else extra
            request = replace(request, system=system)
        async for part in self.model.stream(request):
            yield part
