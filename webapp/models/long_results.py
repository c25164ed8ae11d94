"""A model sent every very long tool result cut short, with a marker that says so.

One result (a file, a web page, a listing) must not fill the model's context. The
run's entries, and so the session and the card the user sees, keep the whole
result; only what the model is sent is cut.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from webapp.runtime.model import Model, ModelPart, ModelRequest
from webapp.transcript import Entry, ToolResultEntry

MAX_RESULT_CHARS = 20_000  # of one tool result, in what the model is sent


def cut_result(output: str, limit: int = MAX_RESULT_CHARS) -> str:
    """``output`` as the model reads it: at most ``limit`` characters, then a marker."""
    if len(output) <= limit:
        return output
    return (
        output[:limit] + f"\n[The tool's result was cut here: {len(output) - limit:,} more "
        "characters are not shown to you. The user sees the whole result.]"
    )


@dataclass(frozen=True)
class CutLongResults:
    """A model whose requests carry each tool result cut to ``limit`` characters."""

    model: Model
    limit: int = MAX_RESULT_CHARS

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        entries = [self._cut(e) for e in request.entries]
        return self.model.stream(replace(request, entries=entries))

    def _cut(self, entry: Entry) -> Entry:
        if isinstance(entry, ToolResultEntry) and len(entry.output) > self.limit:
            return replace(entry, output=cut_result(entry.output, self.limit))
        return entry
