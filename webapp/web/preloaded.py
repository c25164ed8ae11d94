"""A new run's first reads, answered from the transaction that recorded it.

Before it can call the model, a run loads its session's history and looks for
a checkpoint of its own id. `ChatStore.begin_run` has just read the chat's
latest page in the transaction that recorded the run; when that page is the
whole shown path, its entries are that history, and an id the same transaction
entered into the chat's tree (a primary key) has no checkpoint. Answering both
from memory spares the run two trips to the database, each waiting for the
event loop to finish the request's answer first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from webapp.runtime.options import CheckpointOptions
from webapp.stores.checkpoint import Checkpointer, RunHead, RunSnapshot
from webapp.stores.session import Segment, Session
from webapp.transcript import Entry
from webapp.web.chat_store import Page


def preloaded(
    page: Page | None, chat_id: str, session: Session, options: CheckpointOptions
) -> tuple[Session, CheckpointOptions]:
    """The session and checkpoint options for a new run of chat ``chat_id``: its first
    reads answered from ``page``, read with its record, if that is the whole path."""
    if page is None or page.earlier:
        return session, options
    history = [entry for segment in page.segments for entry in segment.entries]
    checkpointer = NewRunCheckpointer(options.checkpointer, options.run_id)
    return PreloadedSession(session, chat_id, history), replace(options, checkpointer=checkpointer)


class PreloadedSession:
    """``session``, whose next `load` of ``session_id`` returns ``entries``."""

    def __init__(self, session: Session, session_id: str, entries: list[Entry]) -> None:
        self._session = session
        self._session_id = session_id
        self._entries: list[Entry] | None = entries

    async def load(self, session_id: str) -> list[Entry]:
        entries, self._entries = self._entries, None  # once: later loads see later writes
        if session_id == self._session_id and entries is not None:
            return entries
        return await self._session.load(session_id)

    async def segments(self, session_id: str) -> list[Segment]:
        return await self._session.segments(session_id)

    async def append(
        self,
        session_id: str,
        entries: list[Entry],
        *,
        run_id: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> str:
        self._entries = None
        return await self._session.append(session_id, entries, run_id=run_id, meta=meta)

    async def clear(self, session_id: str) -> None:
        self._entries = None
        await self._session.clear(session_id)


class NewRunCheckpointer:
    """``checkpointer``, knowing that run ``run_id`` has no checkpoint yet."""

    def __init__(self, checkpointer: Checkpointer, run_id: str) -> None:
        self._checkpointer = checkpointer
        self._new: str | None = run_id

    async def load(self, run_id: str) -> RunSnapshot | None:
        new, self._new = self._new, None  # once: the run writes its own from then on
        if run_id == new:
            return None
        return await self._checkpointer.load(run_id)

    async def append(self, run_id: str, entries: list[Entry], head: RunHead) -> None:
        self._new = None
        await self._checkpointer.append(run_id, entries, head)

    async def delete(self, run_id: str) -> None:
        self._new = None
        await self._checkpointer.delete(run_id)
