"""A new run started from the transaction that records it, before that commits.

Before it can call the model, a run loads its session's history and looks for
a checkpoint of its own id. `ChatStore.begin_run` reads the chat's latest page
in the transaction that records the run; when that page is the whole shown
path, its entries are that history, and an id the same transaction entered
into the chat's tree (a primary key) has no checkpoint. Answering both from
memory spares the run two trips to the database.

`recording` hands the page over as soon as the transaction has run, while its
COMMIT (an fsync) is still under way, so the run can build and send its model
request in what was idle time. Until that commit is through, everything the
run asks of the real stores waits (`PreloadedSession`, `NewRunCheckpointer`:
another connection would not see the record yet, and a write must not outlive
a record that failed), and nobody can watch the run: its id reaches a client
only in the answer drawn after the commit. If the commit fails, the caller
stops the run, and nothing of it was kept or shown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any

from webapp.runtime.options import CheckpointOptions
from webapp.stores.checkpoint import Checkpointer, RunHead, RunSnapshot
from webapp.stores.session import Segment, Session
from webapp.transcript import Entry
from webapp.chats.store import Begun, ChatStore, NewRun, Page


async def recording(
    chats: ChatStore, chat_id: str, new: NewRun, page: int | None
) -> tuple[Begun, asyncio.Future[Begun] | None]:
    """Record ``new`` (`ChatStore.begin_run`), returning once its transaction has run:
    what it read, and the commit still to await (None once it is done)."""
    loop = asyncio.get_running_loop()
    written: asyncio.Future[Begun] = loop.create_future()

    def tell(begun: Begun) -> None:
        if not written.done():  # a batch run again tells again: the first will do
            written.set_result(begun)

    commit = asyncio.ensure_future(chats.begin_run(chat_id, new, page=page, written=tell))
    try:
        await asyncio.wait((commit, written), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        commit.cancel()
        raise
    if commit.done():
        return commit.result(), None  # committed already, or failed before its commit
    return written.result(), commit


def preloaded(
    page: Page | None,
    chat_id: str,
    session: Session,
    options: CheckpointOptions,
    committed: Awaitable[object] | None = None,
) -> tuple[Session, CheckpointOptions]:
    """The session and checkpoint options for a new run of chat ``chat_id``: its first
    reads answered from ``page``, read with its record, if that is the whole path; its
    writes held until ``committed`` (the record's commit, if still under way)."""
    history = None
    if page is not None and not page.earlier:
        history = [entry for segment in page.segments for entry in segment.entries]
    elif committed is None:
        return session, options
    checkpointer = NewRunCheckpointer(
        options.checkpointer, options.run_id if history is not None else None, committed
    )
    preloaded_session = PreloadedSession(session, chat_id, history, committed)
    return preloaded_session, replace(options, checkpointer=checkpointer)


class _AfterCommit:
    """What an adapter asks of a real store waits for ``committed`` (once awaited, no more)."""

    def __init__(self, committed: Awaitable[object] | None) -> None:
        self._committed = committed

    async def _wait_committed(self) -> None:
        if self._committed is not None:
            await self._committed
            self._committed = None


class PreloadedSession(_AfterCommit):
    """``session``, whose next `load` of ``session_id`` returns ``entries`` (if any);
    what goes to ``session`` waits for ``committed``."""

    def __init__(
        self,
        session: Session,
        session_id: str,
        entries: list[Entry] | None,
        committed: Awaitable[object] | None = None,
    ) -> None:
        super().__init__(committed)
        self._session = session
        self._session_id = session_id
        self._entries = entries

    async def load(self, session_id: str) -> list[Entry]:
        entries, self._entries = self._entries, None  # once: later loads see later writes
        if session_id == self._session_id and entries is not None:
            return entries
        await self._wait_committed()
        return await self._session.load(session_id)

    async def segments(self, session_id: str) -> list[Segment]:
        await self._wait_committed()
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
        await self._wait_committed()
        return await self._session.append(session_id, entries, run_id=run_id, meta=meta)

    async def clear(self, session_id: str) -> None:
        self._entries = None
        await self._wait_committed()
        await self._session.clear(session_id)


class NewRunCheckpointer(_AfterCommit):
    """``checkpointer``, knowing that run ``run_id`` (if any) has no checkpoint yet;
    what goes to ``checkpointer`` waits for ``committed``."""

    def __init__(
        self,
        checkpointer: Checkpointer,
        run_id: str | None,
        committed: Awaitable[object] | None = None,
    ) -> None:
        super().__init__(committed)
        self._checkpointer = checkpointer
        self._new = run_id

    async def load(self, run_id: str) -> RunSnapshot | None:
        new, self._new = self._new, None  # once: the run writes its own from then on
        if run_id == new:
            return None
        await self._wait_committed()
        return await self._checkpointer.load(run_id)

    async def append(self, run_id: str, entries: list[Entry], head: RunHead) -> None:
        self._new = None
        await self._wait_committed()
        await self._checkpointer.append(run_id, entries, head)

    async def delete(self, run_id: str) -> None:
        self._new = None
        await self._wait_committed()
        await self._checkpointer.delete(run_id)
