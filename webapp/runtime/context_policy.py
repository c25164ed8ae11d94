"""Context policy: keep long tool outputs out of the model's view, recoverably.

With a result store every tool output is archived under its session and
call_id; the model sees long outputs shortened, and gets a
`recall_tool_result(call_id)` tool that returns the archived original. This is
what makes `trim_tool_results` on the session recoverable: without an archive
a trimmed output is gone for good.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from webapp.runtime.tool import Tool, tool
from webapp.transcript import Entry, ToolCallEntry, ToolResultEntry

RECALL_TOOL = "recall_tool_result"


class ResultStore(Protocol):
    async def save(self, session_key: str, call_id: str, output: str) -> None: ...

    async def load(self, session_key: str, call_id: str) -> str | None: ...


class FileResultStore:
    """One file per tool output under ``directory/<session>/<call_id>.txt``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def _path(self, session_key: str, call_id: str) -> Path:
        # quote() keeps names readable and makes "../" impossible
        return self.directory / quote(session_key, safe="") / (quote(call_id, safe="") + ".txt")

    async def save(self, session_key: str, call_id: str, output: str) -> None:
        await asyncio.to_thread(self._write, self._path(session_key, call_id), output)

    async def load(self, session_key: str, call_id: str) -> str | None:
        path = self._path(session_key, call_id)
        try:
            return await asyncio.to_thread(path.read_text, encoding="utf-8")
        except FileNotFoundError:
            return None

    @staticmethod
    def _write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # readers never see half a file


@dataclass(frozen=True)
class ContextPolicy:
    result_store: ResultStore | None = None
    max_view_chars: int = 4000

    def __post_init__(self) -> None:
        if self.max_view_chars < 1:
            raise ValueError(f"max_view_chars must be >= 1, got {self.max_view_chars!r}")

    def view(self, entries: list[Entry]) -> list[Entry]:
        """The model's view: long archived outputs shortened, recall results kept whole."""
        if self.result_store is None:
            return entries
        names = {e.call_id: e.name for e in entries if isinstance(e, ToolCallEntry)}
        out: list[Entry] = []
        for e in entries:
            if (
                isinstance(e, ToolResultEntry)
                and len(e.output) > self.max_view_chars
                and names.get(e.call_id) != RECALL_TOOL
            ):
                hidden = len(e.output) - self.max_view_chars
                e = replace(
                    e,
                    output=e.output[: self.max_view_chars]
                    + f"\n[{hidden} more characters not shown; call "
                    f'{RECALL_TOOL}("{e.call_id}") for the full output]',
                )
            out.append(e)
        return out

    async def archive(
        self, session_key: str, result: ToolResultEntry, state: dict[str, Any]
    ) -> dict[str, Any]:
        """Archive one output; returns the policy's new carried state."""
        if self.result_store is None:
            return state
        await self.result_store.save(session_key, result.call_id, result.output)
        return {**state, "archived": int(state.get("archived", 0)) + 1}

    def tools(self, session_key: str) -> list[Tool]:
        store = self.result_store
        if store is None:
            return []

        async def recall_tool_result(call_id: str) -> str:
            """Return the full, archived output of an earlier tool call.

            Args:
                call_id: the call_id of the tool call whose output was shortened or trimmed
            """
            text = await store.load(session_key, call_id)
            if text is None:
                raise LookupError(f"no archived output for call_id {call_id!r}")
            return text

        return [tool(recall_tool_result, name=RECALL_TOOL)]
