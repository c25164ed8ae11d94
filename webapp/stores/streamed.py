"""Streamed text of a model turn in flight, saved beside the run's checkpoint.

A checkpoint holds finished model turns only. While a turn streams, the run
saves what it has streamed so far -- its text and reasoning -- as *pieces*:
each save adds one row holding only what streamed since the previous save,
so a save costs what it adds and a 10,000-token reply is never rewritten
(``checkpoint_partials``, keyed by ``(run_id, turn, idx)``). A resume after a
crash reads the pieces of the turn its head says was in flight and goes on
from that text instead of redoing the turn (`webapp.runtime.streaming`).

Invariants, each named for the failure it prevents:
- the pieces of a turn count only while the head says that turn is in flight
  (``head.turns == turn``): once the turn's entries are saved, its pieces are
  stale and never read, so the text is never shown twice;
- a turn's first piece (``idx`` 0) deletes every earlier piece of the run
  before it is added (`statements`; in one transaction on PostgreSQL, just
  before it on SQLite, where an insert that did not commit leaves the turn with
  no pieces: it is redone): a redone turn never reads the pieces of the attempt
  it replaces, and finished turns leave nothing behind;
- a piece stored twice (a retry after a lost reply) is stored once
  (``ON CONFLICT DO NOTHING``);
- a turn that started making tool calls is marked (``calls``): it is redone.

This is a narrow capability of its own (`StreamedCheckpointer`), beside the
`Checkpointer` protocol, whose methods keep their meaning; the built-in
checkpointers have it. The rows go with the run's checkpoint wherever that is
deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from webapp.stores.tx import Tx

TABLE_SQL = """
CREATE TABLE IF NOT EXISTS checkpoint_partials (
    run_id    TEXT    NOT NULL,
    turn      INTEGER NOT NULL,
    idx       INTEGER NOT NULL,
    text      TEXT    NOT NULL,
    reasoning TEXT    NOT NULL,
    calls     INTEGER NOT NULL,
    PRIMARY KEY (run_id, turn, idx)
);
"""

# Written once with ``?`` placeholders, run through a `Tx` on either back end.
CLEAR_SQL = "DELETE FROM checkpoint_partials WHERE run_id = ?"
INSERT_SQL = (
    "INSERT INTO checkpoint_partials (run_id, turn, idx, text, reasoning, calls) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
LOAD_SQL = (
    "SELECT idx, text, reasoning, calls FROM checkpoint_partials "
    "WHERE run_id = ? AND turn = ? ORDER BY idx"
)


async def clear(tx: Tx, run_id: str) -> None:
    """Remove every piece of ``run_id`` (its checkpoint is deleted, or a turn restarts)."""
    await tx.execute(CLEAR_SQL, (run_id,))


def statements(run_id: str, piece: StreamedPiece) -> list[tuple[str, tuple[object, ...]]]:
    """What adding ``piece`` runs, in order: a turn's first piece first deletes every
    earlier piece of the run. One statement each, so a store can send many runs'
    pieces as one ``executemany`` (`webapp.stores.sqlite_checkpoint`)."""
    insert = (INSERT_SQL, piece.row(run_id))
    return [(CLEAR_SQL, (run_id,)), insert] if piece.index == 0 else [insert]


async def save(tx: Tx, run_id: str, piece: StreamedPiece) -> None:
    """Add ``piece`` in ``tx`` (`statements`)."""
    for sql, params in statements(run_id, piece):
        await tx.execute(sql, params)


async def load(tx: Tx, run_id: str, turn: int) -> StreamedTurn | None:
    """The pieces saved for ``turn`` of ``run_id``, joined; None if there are none."""
    rows = await tx.fetch(LOAD_SQL, (run_id, turn))
    return join_pieces([(r[0], r[1], r[2], r[3]) for r in rows])


@dataclass(frozen=True)
class StreamedPiece:
    """What one save adds to the turn in flight (``index`` counts from 0 per turn)."""

    turn: int
    index: int
    text: str = ""
    reasoning: str = ""
    calls: bool = False  # the turn started making tool calls: a resume redoes it

    def __post_init__(self) -> None:
        if self.turn < 0 or self.index < 0:
            raise ValueError(
                f"turn and index must be >= 0, got turn={self.turn!r}, index={self.index!r}"
            )

    def row(self, run_id: str) -> tuple[str, int, int, str, str, int]:
        return (run_id, self.turn, self.index, self.text, self.reasoning, int(self.calls))


@dataclass(frozen=True)
class StreamedTurn:
    """A turn's saved pieces, joined."""

    text: str
    reasoning: str
    calls: bool
    pieces: int  # the index the next piece of this turn takes


def join_pieces(rows: list[tuple[int, str, str, int]]) -> StreamedTurn | None:
    """The turn the rows ``(idx, text, reasoning, calls)`` of one turn make up."""
    if not rows:
        return None
    return StreamedTurn(
        "".join(r[1] for r in rows),
        "".join(r[2] for r in rows),
        any(r[3] for r in rows),
        max(r[0] for r in rows) + 1,
    )


@runtime_checkable
class StreamedCheckpointer(Protocol):
    """A checkpointer that also keeps the streamed text of a run's turn in flight."""

    async def save_streamed(self, run_id: str, piece: StreamedPiece) -> None:
        """Add ``piece`` (index 0 first deletes every earlier piece of the run)."""
        ...

    async def load_streamed(self, run_id: str, turn: int) -> StreamedTurn | None:
        """The pieces saved for ``turn`` of ``run_id``, joined; None if there are none."""
        ...


class InMemoryStreamed:
    """The capability for `InMemoryCheckpointer`: tests only, like it."""

    def __init__(self) -> None:
        self._pieces: dict[str, dict[tuple[int, int], StreamedPiece]] = {}

    async def save_streamed(self, run_id: str, piece: StreamedPiece) -> None:
        if piece.index == 0:
            self._pieces.pop(run_id, None)
        self._pieces.setdefault(run_id, {}).setdefault((piece.turn, piece.index), piece)

    async def load_streamed(self, run_id: str, turn: int) -> StreamedTurn | None:
        pieces = self._pieces.get(run_id, {})
        rows = [
            (p.index, p.text, p.reasoning, int(p.calls))
            for (t, _), p in sorted(pieces.items())
            if t == turn
        ]
        return join_pieces(rows)

    def forget(self, run_id: str) -> None:
        self._pieces.pop(run_id, None)
