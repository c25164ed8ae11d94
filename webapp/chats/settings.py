"""A chat's own model and instructions, and each run's record of its model and usage.

The chat's settings are columns of ``chats`` (SPEC §12): ``model`` (an
``endpoint/model`` name; NULL: the app's default), ``instructions`` (the system
prompt; NULL or empty: the default) and the ``temperature`` and ``max_tokens``
a preset set. Each run's node in ``chat_runs`` records, invariants named for
the failure they prevent:
- ``model``, written with the run's record before the run starts
  (`ChatStore.begin_run`): a resume after a crash takes the model the run
  started with, not one chosen since, so the record never names a model that
  did not write the reply;
- ``tokens_in``/``tokens_out``, the usage its checkpoint summed over its model
  turns, taken in the transaction that records the outcome and deletes the
  checkpoint (`record_outcome`): counted once, and NULL when the endpoint
  reported nothing -- never a guess. A continuation's usage adds to the reply
  it continues (it has no node of its own);
- ``finished_at``, when that outcome was recorded (seconds since 1970). Copies
  (a branch, an import) keep model and usage but no ``finished_at``, so a sum
  per day over ``finished_at`` counts each run's tokens once, when it ran here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from webapp.chats.db import ChatDatabase, Tx
from webapp.stores.codec import decode_head
from webapp.usage import Usage

SCHEMA = """
ALTER TABLE chats ADD COLUMN model TEXT;
ALTER TABLE chats ADD COLUMN instructions TEXT;
ALTER TABLE chats ADD COLUMN temperature REAL;
ALTER TABLE chats ADD COLUMN max_tokens INTEGER;
"""
RUN_SCHEMA = """
ALTER TABLE chat_runs ADD COLUMN model TEXT;
ALTER TABLE chat_runs ADD COLUMN tokens_in INTEGER;
ALTER TABLE chat_runs ADD COLUMN tokens_out INTEGER;
ALTER TABLE chat_runs ADD COLUMN finished_at REAL;
"""
POSTGRES_SCHEMA = SCHEMA.replace(" REAL;", " DOUBLE PRECISION;")
# PostgreSQL's INTEGER is 32 bits: a run's usage (below 2^53) needs BIGINT there.
POSTGRES_RUN_SCHEMA = RUN_SCHEMA.replace(" REAL;", " DOUBLE PRECISION;").replace(
    " INTEGER;", " BIGINT;"
)
POSTGRES_BIGINT_USAGE = """
ALTER TABLE chat_runs ALTER COLUMN tokens_in TYPE BIGINT;
ALTER TABLE chat_runs ALTER COLUMN tokens_out TYPE BIGINT;
"""

MAX_INSTRUCTIONS_CHARS = 20_000


@dataclass(frozen=True)
class ChatSettings:
    model: str | None = None  # endpoint/model; None: the app's default
    instructions: str = ""  # empty: the default system prompt
    temperature: float | None = None
    max_tokens: int | None = None
    run_model: str | None = None  # the model the chat's active run started with


class SettingsStore:
    """The chat settings' reads and writes, on the chat database."""

    def __init__(self, db: ChatDatabase) -> None:
        self._db = db

    async def get(self, chat_id: str) -> ChatSettings | None:
        """The chat's settings (None: no such chat), with its active run's model."""

        rows = await self._db.fetch(
            "SELECT c.model, c.instructions, c.temperature, c.max_tokens, r.model "
            "FROM chats c LEFT JOIN chat_runs r ON r.run_id = c.active_run_id "
            "WHERE c.id = ?",
            (chat_id,),
        )
        if not rows:
            return None
        model, instructions, temperature, max_tokens, run_model = rows[0]
        return ChatSettings(
            model,
            instructions or "",
            float(temperature) if temperature is not None else None,
            int(max_tokens) if max_tokens is not None else None,
            run_model,
        )

    async def set_model(self, chat_id: str, model: str) -> bool:
        """The chat's model from its next run on; False when there is no such chat."""
        return await self._update(chat_id, "model = ?", (model,))

    async def set_instructions(self, chat_id: str, instructions: str) -> bool:
        """The chat's system prompt from its next run on ("" restores the default)."""
        return await self._update(chat_id, "instructions = ?", (instructions or None,))

    async def apply(self, chat_id: str, settings: ChatSettings) -> bool:
        """All of a chat's settings at once (a preset on a new chat)."""
        return await self._update(
            chat_id,
            "model = ?, instructions = ?, temperature = ?, max_tokens = ?",
            (
                settings.model,
                settings.instructions or None,
                settings.temperature,
                settings.max_tokens,
            ),
        )

    async def usage(self, chat_id: str) -> Usage | None:
        """What every run of the chat used, every version included; None when no run
        reported any usage."""

        async def total(tx: Tx) -> Usage | None:
            rows = await tx.fetch(
                # Summed as floats: 64-bit integers overflow on a few huge figures.
                "SELECT SUM(CAST(tokens_in AS DOUBLE PRECISION)), "
                "SUM(CAST(tokens_out AS DOUBLE PRECISION)), COUNT(tokens_in) FROM chat_runs "
                "WHERE chat_id = ?",
                (chat_id,),
            )
            tokens_in, tokens_out, reported = rows[0]
            return Usage(int(tokens_in or 0), int(tokens_out or 0)) if reported else None

        return await self._db.read(total)

    async def _update(self, chat_id: str, assignments: str, params: tuple[object, ...]) -> bool:
        async def update(tx: Tx) -> bool:
            sql = f"UPDATE chats SET {assignments} WHERE id = ?"
            return await tx.execute(sql, (*params, chat_id)) > 0

        return await self._db.write(update)


# --- inside a ChatStore transaction ----------------------------------------------------


async def record_outcome(tx: Tx, run_id: str, into: str) -> None:
    """Record run ``run_id``'s end on the node of run ``into`` (its own, or the reply a
    continuation continues): the usage its checkpoint holds, added, and the time. Call
    in the transaction that deletes that checkpoint, before it does."""
    rows = await tx.fetch("SELECT head_json FROM checkpoint_heads WHERE run_id = ?", (run_id,))
    usage = decode_head(run_id, str(rows[0][0])).usage if rows else Usage()
    if usage.total_tokens == 0:  # the endpoint reported nothing: none is recorded
        await tx.execute(
            "UPDATE chat_runs SET finished_at = ? WHERE run_id = ?", (time.time(), into)
        )
        return
    await tx.execute(
        "UPDATE chat_runs SET tokens_in = COALESCE(tokens_in, 0) + ?, "
        "tokens_out = COALESCE(tokens_out, 0) + ?, finished_at = ? WHERE run_id = ?",
        (usage.input_tokens, usage.output_tokens, time.time(), into),
    )


async def copy_chat(tx: Tx, source: str, target: str) -> None:
    """Chat ``source``'s settings onto chat ``target`` (a branch goes on as it did)."""
    await tx.execute(
        "UPDATE chats SET (model, instructions, temperature, max_tokens) = "
        "(SELECT model, instructions, temperature, max_tokens FROM chats WHERE id = ?) "
        "WHERE id = ?",
        (source, target),
    )


async def copy_run(tx: Tx, source: str, target: str) -> None:
    """Run ``source``'s model and usage onto run ``target``, a copy of it (no finish
    time: the copy cost nothing)."""
    await tx.execute(
        "UPDATE chat_runs SET (model, tokens_in, tokens_out) = "
        "(SELECT model, tokens_in, tokens_out FROM chat_runs WHERE run_id = ?) "
        "WHERE run_id = ?",
        (source, target),
    )
