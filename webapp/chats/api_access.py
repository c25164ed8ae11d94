"""The API's durable records (SPEC §16): people's keys, and the runs programs started.

- ``api_keys``: a key is shown once, at creation; only its SHA-256 is stored
  (a key is 256 random bits, so a fast hash is as safe as a slow one and costs
  a request microseconds). Every request looks its key up in the database, so
  a revoked key is refused at once by every process: there is no cache to go
  stale.
- ``api_runs``: one row per run a program started, keyed by run id, with the
  chat it runs in, who started it, the ``Idempotency-Key`` it came with (one
  row per person and key: the unique index decides a race between two
  processes), a hash of the request body (a repeat with another body is
  refused) and, once a reader saw it end, the answer, so a replay is one
  indexed read and never a model call. ``hidden``: the program did not ask to
  store the conversation; its chat stays out of the chat list and goes with the
  row when the row expires (`expired`).
"""

from __future__ import annotations

import hashlib
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

from webapp.chats import tree as chat_tree
from webapp.chats.db import ChatDatabase, Tx
from webapp.chats.session_rows import append_segments
from webapp.chats.users import Owner
from webapp.stores.codec import StoredSegment
from webapp.stores.session import new_run_id
from webapp.transcript import Entry

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY,
    user_id TEXT,
    label TEXT NOT NULL,
    key_hash TEXT NOT NULL UNIQUE,
    hint TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL
);
CREATE INDEX IF NOT EXISTS api_keys_by_user ON api_keys (user_id);
CREATE TABLE IF NOT EXISTS api_runs (
    run_id TEXT PRIMARY KEY,
    chat_id TEXT NOT NULL,
    person TEXT NOT NULL,
    idempotency_key TEXT,
    body_hash TEXT NOT NULL,
    model TEXT NOT NULL,
    hidden INTEGER NOT NULL,
    created_at REAL NOT NULL,
    seen_at REAL NOT NULL,
    tools TEXT,
    answer TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS api_runs_by_key ON api_runs (person, idempotency_key);
CREATE INDEX IF NOT EXISTS api_runs_by_chat ON api_runs (chat_id);
CREATE INDEX IF NOT EXISTS api_runs_by_time ON api_runs (created_at);
"""
POSTGRES_SCHEMA = SCHEMA.replace(" REAL", " DOUBLE PRECISION")

KEY_PREFIX = "wa-"
MAX_LABEL_CHARS = 100
_RUN_COLUMNS = (
    "run_id, chat_id, person, idempotency_key, body_hash, model, hidden, created_at, tools"
)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def person_of(owner: Owner) -> str:
    """Whose runs these are, as the idempotency records name them ("" for the one user
    of an app without accounts)."""
    return owner.user_id or ""


@dataclass(frozen=True)
class ApiKey:
    id: str
    label: str
    hint: str  # the key's last characters, to tell keys apart on the page
    created_at: float
    revoked: bool


@dataclass(frozen=True)
class ApiRun:
    run_id: str
    chat_id: str
    person: str
    idempotency_key: str | None
    body_hash: str
    model: str
    hidden: bool
    created_at: float
    tools: str | None = None  # the caller's tools, JSON: offered to the model, run by nobody

    @property
    def owner(self) -> Owner:
        return Owner(self.person or None)


def _run(row: Any) -> ApiRun:
    return ApiRun(
        str(row[0]),
        str(row[1]),
        str(row[2]),
        None if row[3] is None else str(row[3]),
        str(row[4]),
        str(row[5]),
        bool(row[6]),
        float(row[7]),
        None if row[8] is None else str(row[8]),
    )


class ApiKeys:
    """People's API keys: made, listed, revoked, and looked up on each request."""

    def __init__(self, db: ChatDatabase) -> None:
        self._db = db

    async def create(self, owner: Owner, label: str) -> tuple[ApiKey, str]:
        """A new key for ``owner``: its record, and the key itself (never stored)."""
        label = label.strip()
        if not label or len(label) > MAX_LABEL_CHARS:
            raise ValueError(
                f"a key name is 1 to {MAX_LABEL_CHARS} characters, got {label[:120]!r}"
            )
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        made = ApiKey(uuid.uuid4().hex, label, key[-4:], time.time(), False)

        async def insert(tx: Tx) -> None:
            await tx.execute(
                "INSERT INTO api_keys (id, user_id, label, key_hash, hint, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (made.id, owner.user_id, label, key_hash(key), made.hint, made.created_at),
            )

        await self._db.write(insert)
        return made, key

    async def of(self, owner: Owner) -> list[ApiKey]:
        """The person's keys (revoked ones too), newest first."""
        where = "user_id = ?" if owner.user_id is not None else "user_id IS NULL"
        params = (owner.user_id,) if owner.user_id is not None else ()
        sql = (
            "SELECT id, label, hint, created_at, revoked_at FROM api_keys "
            f"WHERE {where} ORDER BY created_at DESC, id"
        )

        async def select(tx: Tx) -> list[ApiKey]:
            rows = await tx.fetch(sql, params)
            return [
                ApiKey(str(r[0]), str(r[1]), str(r[2]), float(r[3]), r[4] is not None) for r in rows
            ]

        return await self._db.read(select)

    async def revoke(self, owner: Owner, key_id: str) -> bool:
        """Revoke one of the person's keys; False when it is not theirs (or not a key)."""
        where = "user_id = ?" if owner.user_id is not None else "user_id IS NULL"
        params = (owner.user_id,) if owner.user_id is not None else ()
        sql = f"UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL AND {where}"
        return await self._db.write(lambda tx: tx.execute(sql, (time.time(), key_id, *params))) > 0

    async def holder(self, key: str) -> Owner | None:
        """Whose key this is, if it is a key and not revoked (nor its person disabled)."""
        sql = (
            "SELECT k.user_id FROM api_keys k LEFT JOIN users u ON u.id = k.user_id "
            "WHERE k.key_hash = ? AND k.revoked_at IS NULL AND "
            "(k.user_id IS NULL OR (u.id IS NOT NULL AND u.disabled = 0))"
        )

        async def select(tx: Tx) -> Owner | None:
            rows = await tx.fetch(sql, (key_hash(key),))
            return Owner(None if rows[0][0] is None else str(rows[0][0])) if rows else None

        return await self._db.read(select)


class ApiRuns:
    """The runs programs started: found by run id or by person and idempotency key."""

    def __init__(self, db: ChatDatabase) -> None:
        self._db = db

    async def add(self, run: ApiRun) -> ApiRun:
        """Record ``run``; when the person already has a run under its idempotency key,
        nothing is written and that run is returned instead."""

        async def insert(tx: Tx) -> ApiRun:
            if run.idempotency_key is not None:
                found = await _by_key(tx, run.person, run.idempotency_key)
                if found is not None:
                    return found
            added = await tx.execute(
                f"INSERT INTO api_runs ({_RUN_COLUMNS}, seen_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    run.run_id,
                    run.chat_id,
                    run.person,
                    run.idempotency_key,
                    run.body_hash,
                    run.model,
                    int(run.hidden),
                    run.created_at,
                    run.tools,
                    run.created_at,
                ),
            )
            if not added and run.idempotency_key is not None:  # another process was first
                found = await _by_key(tx, run.person, run.idempotency_key)
                if found is not None:
                    return found
            return run

        return await self._db.write(insert)

    async def by_key(self, person: str, key: str) -> ApiRun | None:
        return await self._db.read(lambda tx: _by_key(tx, person, key))

    async def get(self, person: str, run_id: str) -> ApiRun | None:
        async def select(tx: Tx) -> ApiRun | None:
            rows = await tx.fetch(
                f"SELECT {_RUN_COLUMNS} FROM api_runs WHERE run_id = ? AND person = ?",
                (run_id, person),
            )
            return _run(rows[0]) if rows else None

        return await self._db.read(select)

    async def tools_of(self, chat_id: str) -> str | None:
        """The caller's tools (JSON) of the API run in ``chat_id``; None: no API run's chat."""

        rows = await self._db.fetch(
            "SELECT tools FROM api_runs WHERE chat_id = ? ORDER BY created_at LIMIT 1",
            (chat_id,),
        )
        return None if not rows else str(rows[0][0] or "[]")

    async def answer(self, run_id: str) -> str | None:
        """The stored answer (JSON) of an ended run, if a reader saw it end."""

        async def select(tx: Tx) -> str | None:
            rows = await tx.fetch("SELECT answer FROM api_runs WHERE run_id = ?", (run_id,))
            return None if not rows or rows[0][0] is None else str(rows[0][0])

        return await self._db.read(select)

    async def keep_answer(self, run_id: str, answer: str) -> None:
        """Store an ended run's answer; the first one stored stays."""
        sql = "UPDATE api_runs SET answer = ? WHERE run_id = ? AND answer IS NULL"
        await self._db.write(lambda tx: tx.execute(sql, (answer, run_id)))

    async def seen(self, run_id: str) -> None:
        """A client of the run is reading it now (from any process)."""
        sql = "UPDATE api_runs SET seen_at = ? WHERE run_id = ?"
        await self._db.write(lambda tx: tx.execute(sql, (time.time(), run_id)))

    async def unanswered(self, since: float) -> list[ApiRun]:
        """The runs made since ``since`` that no reader has seen end, each marked seen now
        (their clients get the orphan time again, counted from now)."""

        async def select(tx: Tx) -> list[ApiRun]:
            where = "WHERE answer IS NULL AND created_at >= ?"
            await tx.execute(f"UPDATE api_runs SET seen_at = ? {where}", (time.time(), since))
            rows = await tx.fetch(f"SELECT {_RUN_COLUMNS} FROM api_runs {where}", (since,))
            return [_run(r) for r in rows]

        return await self._db.write(select)

    async def seen_at(self, run_id: str) -> float | None:
        async def select(tx: Tx) -> float | None:
            rows = await tx.fetch("SELECT seen_at FROM api_runs WHERE run_id = ?", (run_id,))
            return float(rows[0][0]) if rows else None

        return await self._db.read(select)

    async def forget(self, run_id: str) -> None:
        """A run that never started (refused by a limit): its record goes."""
        sql = "DELETE FROM api_runs WHERE run_id = ?"
        await self._db.write(lambda tx: tx.execute(sql, (run_id,)))

    async def expired(self, before: float) -> list[tuple[str, str, bool]]:
        """(run id, chat id, hidden) of the ended records made before ``before``."""

        async def select(tx: Tx) -> list[tuple[str, str, bool]]:
            rows = await tx.fetch(
                "SELECT run_id, chat_id, hidden FROM api_runs WHERE created_at < ? "
                "AND answer IS NOT NULL",
                (before,),
            )
            return [(str(r[0]), str(r[1]), bool(r[2])) for r in rows]

        return await self._db.read(select)

    async def seed(self, chat_id: str, turns: list[list[Entry]]) -> None:
        """The conversation a request brings before its last message: one segment (and
        one node of the chat's tree) per turn, in a chat with no runs yet."""
        if not turns:
            return

        async def write(tx: Tx) -> None:
            segments = [StoredSegment.encode(new_run_id(), t, None) for t in turns]
            await append_segments(tx, chat_id, segments)
            await chat_tree.backfill(tx, chat_id, None)

        await self._db.write(write)

    async def remove(self, run_ids: list[str]) -> None:
        async def delete(tx: Tx) -> None:
            await tx.executemany("DELETE FROM api_runs WHERE run_id = ?", [(r,) for r in run_ids])

        await self._db.write(delete)


async def _by_key(tx: Tx, person: str, key: str) -> ApiRun | None:
    rows = await tx.fetch(
        f"SELECT {_RUN_COLUMNS} FROM api_runs WHERE person = ? AND idempotency_key = ?",
        (person, key),
    )
    return _run(rows[0]) if rows else None


HIDDEN_CHATS = "id NOT IN (SELECT chat_id FROM api_runs WHERE hidden = 1)"
