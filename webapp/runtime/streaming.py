"""A model turn's streamed text, saved while it streams and continued after a crash.

The design note lets a crash lose the model turn in flight: it is redone from
the last checkpoint. A person reading the reply sees that as the answer going
back to nothing and then saying something else, so the run does better
(SPEC §6, "A crash keeps what the user saw"):

- **while a turn streams**, `TurnSaver` saves its text and reasoning so far
  beside the checkpoint (`webapp.stores.streamed`), a piece at most
  `SAVE_INTERVAL` seconds after the text it holds arrived. The pieces are
  batched (one write per interval, whatever the token rate) and each holds
  only what is new, so a save costs what it adds. Every run's writes start on
  the ticks of one clock (multiples of `SAVE_INTERVAL` of the loop's time), so
  the saves of many replies streaming at once reach the store together and
  share its transaction (group commit): 50 replies at a model's pace cost five
  commits a second, not 250;
- **on resume**, a turn that had streamed text (`resumable_turn`) is not
  redone: the saved text stays the reply's beginning and the model is asked
  to continue it, exactly as Continue does (`ModelRequest.continue_final`,
  `continue_view`). A turn with no text yet, or one that started making tool
  calls, is redone as the design note says;
- **on a cancel** (a Stop, or a server shutdown that a restart resumes) the
  pieces not yet written are written at once, so a resume loses nothing seen.

A checkpointer without the capability (`StreamedCheckpointer`) gets
`NO_SAVES`: its runs redo the turn in flight, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Protocol

from webapp.runtime.options import CheckpointOptions
from webapp.stores.checkpoint import Checkpointer
from webapp.stores.streamed import StreamedCheckpointer, StreamedPiece, StreamedTurn
from webapp.transcript import AssistantEntry, Entry, ReasoningEntry

logger = logging.getLogger("webapp.runtime.streaming")

# Writes start on multiples of this (the loop's clock), the same for every run. Text
# waits at most this plus FIRST_WAIT for its write: below the 250 ms SPEC §6 allows.
SAVE_INTERVAL = 0.2
FIRST_WAIT = 0.03  # a turn's first text is not written sooner than this after it came


class Saves(Protocol):
    """What the run loop tells the saves of one model turn."""

    def add_text(self, text: str) -> None: ...

    def add_reasoning(self, text: str) -> None: ...

    def mark_calls(self) -> None: ...

    async def close(self, *, flush: bool) -> None: ...


class _NoSaves:
    """A checkpointer that cannot keep streamed text: nothing to save."""

    def add_text(self, text: str) -> None:
        pass

    def add_reasoning(self, text: str) -> None:
        pass

    def mark_calls(self) -> None:
        pass

    async def close(self, *, flush: bool) -> None:
        pass


NO_SAVES: Saves = _NoSaves()


class TurnSaver:
    """Saves one turn's streamed text, one piece per `SAVE_INTERVAL` at most.

    A write starts on a tick of the shared clock. The turn's first text waits for
    the first tick at least `FIRST_WAIT` away (not at once: a reply's first token
    and its readers' requests do not queue behind a write, and a reply shorter
    than that is never written piecemeal); later text for the next tick after the
    previous write's (and for that write to end).
    The turn's first piece also clears the run's earlier pieces. A failed write
    fails the run at its next token (like a failed checkpoint save), never
    silently.
    """

    def __init__(
        self, store: StreamedCheckpointer, run_id: str, turn: int, first_index: int = 0
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.turn = turn
        self.index = first_index  # of the next piece
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls = False
        self._marked = False  # the calls mark is written
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._writing: asyncio.Task[None] | None = None
        self._last_tick: int | None = None  # the tick the previous write started on
        self._error: Exception | None = None

    def add_text(self, text: str) -> None:
        self._text.append(text)
        self._schedule()

    def add_reasoning(self, text: str) -> None:
        self._reasoning.append(text)
        self._schedule()

    def mark_calls(self) -> None:
        """The turn started making tool calls: a resume must redo it, not continue it."""
        if self._calls:
            return
        self._calls = True
        if self.index > 0 or self._text or self._reasoning:  # else nothing of it is saved
            self._schedule()

    async def close(self, *, flush: bool) -> None:
        """End the turn's saves: with ``flush``, write what is pending now (a cancel);
        else drop it (the turn's own checkpoint save follows). Raises a failed write."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writing is not None:
            await asyncio.shield(self._writing)
        if flush and self._error is None and self._pending():
            await self._write(self._take())
        self._text.clear()
        self._reasoning.clear()
        self._raise()

    # --- internals ------------------------------------------------------------------

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _pending(self) -> bool:
        return bool(self._text or self._reasoning) or (self._calls and not self._marked)

    def _schedule(self) -> None:
        self._raise()
        if self._closed or self._timer is not None or self._writing is not None:
            return  # the timer, or the end of the write under way, takes it
        loop = asyncio.get_running_loop()
        now = loop.time()
        wait = FIRST_WAIT if self._last_tick is None else 0.0
        tick = math.ceil((now + wait) / SAVE_INTERVAL)
        if self._last_tick is not None:
            tick = max(tick, self._last_tick + 1)
        # The timer runs in this context: the write's task keeps the run's fence.
        self._timer = loop.call_at(tick * SAVE_INTERVAL, self._start_write, tick)

    def _take(self) -> StreamedPiece:
        piece = StreamedPiece(
            self.turn, self.index, "".join(self._text), "".join(self._reasoning), self._calls
        )
        self.index += 1
        self._marked = self._calls
        self._text.clear()
        self._reasoning.clear()
        return piece

    def _start_write(self, tick: int) -> None:
        self._timer = None
        if not self._pending():
            return
        self._last_tick = tick
        piece = self._take()
        self._writing = asyncio.get_running_loop().create_task(self._write_then_next(piece))

    async def _write_then_next(self, piece: StreamedPiece) -> None:
        try:
            await self._write(piece)
        finally:
            self._writing = None
        if self._pending() and self._error is None and not self._closed:
            self._schedule()

    async def _write(self, piece: StreamedPiece) -> None:
        try:
            await self.store.save_streamed(self.run_id, piece)
        except Exception as exc:  # noqa: BLE001 -- raised in the run at its next token
            logger.warning("run %s: could not save its streamed text: %s", self.run_id, exc)
            self._error = exc


def turn_saves(
    options: CheckpointOptions | None, run_id: str, turn: int, resumed: StreamedTurn | None
) -> Saves:
    """The saves of turn ``turn`` of ``run_id``, after the pieces of ``resumed`` if it
    goes on from them (`NO_SAVES` without a checkpointer that can keep them)."""
    checkpointer = options.checkpointer if options is not None else None
    if isinstance(checkpointer, StreamedCheckpointer):
        return TurnSaver(checkpointer, run_id, turn, resumed.pieces if resumed else 0)
    return NO_SAVES


async def resumable_turn(
    options: CheckpointOptions | Checkpointer | None, run_id: str, turn: int
) -> StreamedTurn | None:
    """The streamed text a resume of ``run_id`` continues turn ``turn`` from; None when
    the turn is to be redone (no text saved, or it was making tool calls)."""
    checkpointer = options.checkpointer if isinstance(options, CheckpointOptions) else options
    if not isinstance(checkpointer, StreamedCheckpointer):
        return None
    found = await checkpointer.load_streamed(run_id, turn)
    if found is None or found.calls or not found.text:
        return None
    return found


def continue_view(view: list[Entry], resumed: StreamedTurn | None) -> list[Entry]:
    """The model view of a turn, with the text a resume goes on from (if any) as the
    final assistant message to continue. A continuation's saved text joins the reply
    it continues, so the model sees one message, not two in a row."""
    if resumed is None:
        return view
    text = resumed.text
    if view and isinstance(view[-1], AssistantEntry):
        return [*view[:-1], AssistantEntry(view[-1].text + text)]
    return [*view, AssistantEntry(text)]


def streamed_entries(turn: StreamedTurn | None) -> list[Entry]:
    """What a turn had streamed, as the entries its resume will finish it as."""
    if turn is None:
        return []
    return [
        *([ReasoningEntry(turn.reasoning)] if turn.reasoning else []),
        AssistantEntry(turn.text),
    ]


async def close_quietly(saves: Saves, *, flush: bool) -> None:
    """End a turn's saves where the run's own outcome wins over a failed write."""
    with contextlib.suppress(Exception):
        await saves.close(flush=flush)
