"""Tool approvals in the chat database: the cards' decisions, each chat's grants, the runs
that wait (SPEC §11).

A run's checkpoint holds what the runtime needs to resume it (the waiting calls
and the decisions it applies, `webapp.runtime.approvals`); these tables hold
what the app needs besides, each named for the failure it prevents:

- ``tool_decisions`` -- what the user answered on one card, the first answer
  standing (the key is the call): a double click, a second tab or a second
  process records nothing new. Written before the run resumes, and copied into
  the checkpoint by every resume, so a crash between the click and the resume
  still applies it. Kept after the run ends, so a finished reply's card still
  says Allowed or Denied after a reload or a restart.
- ``tool_grants`` -- **Always allow**: the tools a chat runs without asking.
- ``paused_runs`` -- a run that waits for the user: nothing executes it, and
  neither start-up recovery nor another process takes it over, so a waiting
  run costs no task and no CPU. A decision removes the row in the same
  transaction that records it; the row goes with the run's checkpoint too.

The functions taking a `Tx` work inside a transaction of `ChatStore`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Literal

from webapp.chats.db import ChatDatabase, Tx

Decision = Literal["allow", "always", "deny"]
DECISIONS: tuple[str, ...] = ("allow", "always", "deny")

SCHEMA = """
CREATE TABLE IF NOT EXISTS tool_decisions (
    run_id     TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    chat_id    TEXT NOT NULL,
    decision   TEXT NOT NULL,
    decided_at REAL NOT NULL,
    PRIMARY KEY (run_id, call_id)
);
CREATE INDEX IF NOT EXISTS tool_decisions_by_chat ON tool_decisions (chat_id);
CREATE TABLE IF NOT EXISTS tool_grants (
    chat_id    TEXT NOT NULL,
    tool       TEXT NOT NULL,
    granted_at REAL NOT NULL,
    PRIMARY KEY (chat_id, tool)
);
CREATE TABLE IF NOT EXISTS paused_runs (
    run_id    TEXT PRIMARY KEY,
    chat_id   TEXT NOT NULL,
    paused_at REAL NOT NULL
);
"""
POSTGRES_SCHEMA = SCHEMA.replace(" REAL ", " DOUBLE PRECISION ")


async def forget_chat(tx: Tx, chat_id: str) -> None:
    """A deleted chat's decisions and grants (its paused run goes with its checkpoint)."""
    await tx.execute("DELETE FROM tool_decisions WHERE chat_id = ?", (chat_id,))
    await tx.execute("DELETE FROM tool_grants WHERE chat_id = ?", (chat_id,))


class ToolApprovals:
    """The three tables, over the chat database `ChatStore` opened."""

    def __init__(self, db: ChatDatabase) -> None:
        self._db = db

    async def pause(self, chat_id: str, run_id: str, spent: Iterable[str]) -> None:
        """Run ``run_id`` waits for the user. ``spent``: its calls that a crash cut short,
        whose earlier decisions no longer stand (the user decides them again)."""
        calls = [(run_id, call_id) for call_id in spent]

        async def write(tx: Tx) -> None:
            await tx.executemany(
                "DELETE FROM tool_decisions WHERE run_id = ? AND call_id = ?", calls
            )
            await tx.execute(
                "INSERT INTO paused_runs (run_id, chat_id, paused_at) VALUES (?, ?, ?) "
                "ON CONFLICT (run_id) DO NOTHING",
                (run_id, chat_id, time.time()),
            )

        await self._db.write(write)

    async def decide(
        self,
        chat_id: str,
        run_id: str,
        decisions: Mapping[str, Decision],
        grant: str | None = None,
    ) -> None:
        """Record decisions (a call decided before keeps its first one) and, with
        ``grant``, let that tool run unasked in the chat from now on; the run no longer
        waits. One transaction."""
        now = time.time()
        rows = [(run_id, call_id, chat_id, d, now) for call_id, d in decisions.items()]

        async def write(tx: Tx) -> None:
            await tx.executemany(
                "INSERT INTO tool_decisions (run_id, call_id, chat_id, decision, decided_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, call_id) DO NOTHING",
                rows,
            )
            if grant is not None:
                await tx.execute(
                    "INSERT INTO tool_grants (chat_id, tool, granted_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (chat_id, tool) DO NOTHING",
                    (chat_id, grant, now),
                )
            await tx.execute("DELETE FROM paused_runs WHERE run_id = ?", (run_id,))

        await self._db.write(write)

    async def of_run(self, run_id: str) -> dict[str, Decision]:
        """call_id -> decision, for one run."""

        async def select(tx: Tx) -> dict[str, Decision]:
            rows = await tx.fetch(
                "SELECT call_id, decision FROM tool_decisions WHERE run_id = ?", (run_id,)
            )
            return {str(r[0]): _decision(r[1]) for r in rows}

        return await self._db.read(select)

    async def of_chat(self, chat_id: str) -> dict[str, dict[str, Decision]]:
        """run_id -> call_id -> decision, for every run of the chat that has some."""

        async def select(tx: Tx) -> dict[str, dict[str, Decision]]:
            rows = await tx.fetch(
                "SELECT run_id, call_id, decision FROM tool_decisions WHERE chat_id = ?",
                (chat_id,),
            )
            found: dict[str, dict[str, Decision]] = {}
            for run_id, call_id, decision in rows:
                found.setdefault(str(run_id), {})[str(call_id)] = _decision(decision)
            return found

        return await self._db.read(select)

    async def grants(self, chat_id: str) -> set[str]:
        """The tools the chat always allows."""

        rows = await self._db.fetch("SELECT tool FROM tool_grants WHERE chat_id = ?", (chat_id,))
        return {str(r[0]) for r in rows}

    async def paused(self) -> set[str]:
        """The run ids of every run waiting for a decision."""

        async def select(tx: Tx) -> set[str]:
            return {str(r[0]) for r in await tx.fetch("SELECT run_id FROM paused_runs")}

        return await self._db.read(select)


def _decision(value: object) -> Decision:
    if value not in DECISIONS:
        raise ValueError(
            f"tool_decisions holds the decision {value!r}, not one of {DECISIONS}; "
            "the row was written by something other than this app: delete it"
        )
    return value  # type: ignore[return-value]
