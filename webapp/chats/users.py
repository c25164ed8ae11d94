"""People: accounts, their sign-in sessions and failed sign-in counters (SPEC §13).

Everything here lives in the chat database, beside the chats, so any number
of app processes on one PostgreSQL database share it: a session opened
through one process is honoured by every other, a sign-out or a disable ends
it everywhere at once, and the failure counters count every process's
attempts.

Invariants, each named for the failure it prevents:
- a chat operation names whose chats it may touch (`Owner`); the chat
  layer's queries filter by it, so one person's chat never answers another's
  request, whatever route or view asked;
- a session's cookie value is never stored, only its SHA-256: a copy of the
  database opens no one's session;
- a password is stored only as an Argon2 hash (`webapp.chats.passwords`);
- a failed sign-in is counted before the password is checked, in one
  statement, so a burst of guesses sent at once cannot all slip under the
  limit between a read and a write.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

from webapp.chats import share_rows
from webapp.chats.db import ChatDatabase, Tx


@dataclass(frozen=True)
class Owner:
    """On whose behalf a chat operation runs: the chats it may see and change.

    ``user_id`` None stands for every chat: the one implicit user of an app
    without accounts (``--auth none`` or ``token``), and the server's own
    bookkeeping of the runs it owes.
    """

    user_id: str | None

    def condition(self, column: str = "user_id") -> tuple[str, tuple[Any, ...]]:
        """An ``AND ...`` clause that keeps rows of this owner's chats, and its parameters."""
        if self.user_id is None:
            return "", ()
        return f" AND {column} = ?", (self.user_id,)


EVERY_CHAT = Owner(None)

# The chats' owner column, and the tables of people: fresh databases run it after the
# chats' own schema, older ones as one migration step (ADD COLUMN works on both).
_TABLES = """
CREATE INDEX IF NOT EXISTS chats_by_user ON chats (user_id, updated_at DESC, id);
CREATE TABLE IF NOT EXISTS users (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    password_hash TEXT,
    is_admin INTEGER NOT NULL DEFAULT 0,
    disabled INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS user_sessions (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    seen_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS user_sessions_by_user ON user_sessions (user_id);
CREATE TABLE IF NOT EXISTS sign_in_failures (
    key TEXT PRIMARY KEY,
    failures INTEGER NOT NULL,
    since REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sign_in_failures_by_time ON sign_in_failures (since);
"""
SQLITE_SCHEMA = "ALTER TABLE chats ADD COLUMN user_id TEXT;\n" + _TABLES
POSTGRES_SCHEMA = "ALTER TABLE chats ADD COLUMN IF NOT EXISTS user_id TEXT;\n" + _TABLES.replace(
    " REAL ", " DOUBLE PRECISION "
)

SESSION_IDLE_SECONDS = 14 * 86400  # a session unused this long is over
_SEEN_EVERY = 3600.0  # how stale a session's last use may be before it is written again
_NAME = re.compile(r"^[a-z0-9][a-z0-9._@+-]{0,63}$")
_ACCOUNT = "id, name, is_admin, disabled, created_at"


class UserNameError(ValueError):
    """A user name that is not allowed, or already taken."""


@dataclass(frozen=True)
class Account:
    id: str
    name: str
    is_admin: bool
    disabled: bool
    created_at: float

    @property
    def owner(self) -> Owner:
        return Owner(self.id)


def _account(row: Any) -> Account:
    return Account(str(row[0]), str(row[1]), bool(row[2]), bool(row[3]), float(row[4]))


def user_name(raw: str) -> str:
    """A user name as stored: trimmed and lower case (``Alice`` signs in as ``alice``);
    `UserNameError` when it is not 1-64 letters, digits and ``. _ @ + -``."""
    name = raw.strip().lower()
    if not _NAME.match(name):
        raise UserNameError(
            f"{raw.strip()[:80]!r} is not a user name: use 1 to 64 letters, digits and "
            ". _ @ + - (starting with a letter or digit)."
        )
    return name


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ThrottlePolicy:
    """How failed sign-ins are slowed, then refused, per user name and per address.

    Within ``window`` seconds of a key's first failure, each attempt after
    ``slow_after`` failures waits ``delay`` seconds longer than the one before
    (at most ``max_delay``), and attempts after ``refuse_after`` failures are
    refused until the window ends. An address gets
    ``address_factor`` times the allowance: many people may share one.
    """

    window: float = 900.0
    slow_after: int = 5
    refuse_after: int = 10
    delay: float = 0.25
    max_delay: float = 2.0
    address_factor: int = 5


@dataclass(frozen=True)
class Attempt:
    """What the counters say about one sign-in attempt (already counted)."""

    delay: float  # seconds to wait before checking the password
    refused_until: float | None  # set: refuse the attempt without checking it


class Users:
    """The people tables of one chat database (the `ChatStore`'s own connection)."""

    def __init__(self, db: ChatDatabase, policy: ThrottlePolicy | None = None) -> None:
        self._db = db
        self.policy = policy or ThrottlePolicy()

    # --- accounts ---------------------------------------------------------------------

    async def add(self, name: str, password_hash: str | None, *, admin: bool = False) -> Account:
        """A new account; `UserNameError` if the name is taken. The first admin of a
        database that has chats from before accounts is given those chats."""
        account = Account(uuid.uuid4().hex, user_name(name), admin, False, time.time())

        async def insert(tx: Tx) -> None:
            first_admin = admin and not await tx.fetch("SELECT 1 FROM users WHERE is_admin = 1")
            added = await tx.execute(
                "INSERT INTO users (id, name, password_hash, is_admin, disabled, created_at) "
                "VALUES (?, ?, ?, ?, 0, ?) ON CONFLICT (name) DO NOTHING",
                (account.id, account.name, password_hash, int(admin), account.created_at),
            )
            if not added:
                raise UserNameError(f"There is already a user named {account.name!r}.")
            if first_admin:
                await tx.execute(
                    "UPDATE chats SET user_id = ? WHERE user_id IS NULL", (account.id,)
                )

        await self._db.write(insert)
        return account

    async def on_first_sight(self, name: str) -> Account:
        """The account named ``name``, created now if there is none (trusted header mode)."""
        normal = user_name(name)
        found = await self.find(normal)
        if found is not None:
            return found
        fresh = Account(uuid.uuid4().hex, normal, False, False, time.time())

        async def insert(tx: Tx) -> Account:
            await tx.execute(
                "INSERT INTO users (id, name, password_hash, is_admin, disabled, created_at) "
                "VALUES (?, ?, NULL, 0, 0, ?) ON CONFLICT (name) DO NOTHING",
                (fresh.id, fresh.name, fresh.created_at),
            )
            rows = await tx.fetch(f"SELECT {_ACCOUNT} FROM users WHERE name = ?", (normal,))
            return _account(rows[0])  # ours, or the one another request made meanwhile

        return await self._db.write(insert)

    async def find(self, name: str) -> Account | None:
        found = await self._one(f"SELECT {_ACCOUNT} FROM users WHERE name = ?", name)
        return _account(found) if found is not None else None

    async def get(self, user_id: str) -> Account | None:
        found = await self._one(f"SELECT {_ACCOUNT} FROM users WHERE id = ?", user_id)
        return _account(found) if found is not None else None

    async def password_hash(self, name: str) -> tuple[Account, str | None] | None:
        found = await self._one(f"SELECT {_ACCOUNT}, password_hash FROM users WHERE name = ?", name)
        return (_account(found), found[5]) if found is not None else None

    async def everyone(self) -> list[Account]:
        rows = await self._db.read(
            lambda tx: tx.fetch(f"SELECT {_ACCOUNT} FROM users ORDER BY name")
        )
        return [_account(r) for r in rows]

    async def set_password(self, user_id: str, password_hash: str) -> bool:
        return await self._change(
            "UPDATE users SET password_hash = ? WHERE id = ?", password_hash, user_id
        )

    async def set_disabled(self, user_id: str, disabled: bool) -> bool:
        """Disabling also ends the account's sessions and revokes its chats' share links,
        in the same transaction."""

        async def change(tx: Tx) -> bool:
            if disabled:
                await tx.execute("DELETE FROM user_sessions WHERE user_id = ?", (user_id,))
                await share_rows.forget_owner(tx, user_id)  # their links are revoked, for good
            return (
                await tx.execute(
                    "UPDATE users SET disabled = ? WHERE id = ?", (int(disabled), user_id)
                )
                > 0
            )

        return await self._db.write(change)

    # --- sessions ---------------------------------------------------------------------

    async def open_session(self, user_id: str, *, replacing: str | None = None) -> str:
        """A new session of ``user_id``; returns the cookie value. ``replacing``: the
        session cookie the browser came with, which ends here (a planted or an old
        session id never becomes the signed-in one)."""
        token = secrets.token_urlsafe(32)
        now = time.time()

        async def insert(tx: Tx) -> None:
            if replacing:
                await tx.execute("DELETE FROM user_sessions WHERE id = ?", (_digest(replacing),))
            await tx.execute(
                "INSERT INTO user_sessions (id, user_id, created_at, seen_at) VALUES (?, ?, ?, ?)",
                (_digest(token), user_id, now, now),
            )

        await self._db.write(insert)
        return token

    async def session(self, token: str) -> Account | None:
        """The enabled account whose unexpired session ``token`` is, else None. A session
        in use is written back at most once an hour, so it stays alive while used."""
        now = time.time()
        digest = _digest(token)
        found = await self._one(
            "SELECT u.id, u.name, u.is_admin, u.disabled, u.created_at, s.seen_at "
            "FROM user_sessions s JOIN users u ON u.id = s.user_id "
            "WHERE s.id = ? AND u.disabled = 0 AND s.seen_at > ?",
            digest,
            now - SESSION_IDLE_SECONDS,
        )
        if found is None:
            return None
        if now - float(found[5]) > _SEEN_EVERY:
            await self._change("UPDATE user_sessions SET seen_at = ? WHERE id = ?", now, digest)
        return _account(found)

    async def close_session(self, token: str) -> None:
        await self._change("DELETE FROM user_sessions WHERE id = ?", _digest(token))

    async def sign_out_everywhere(self, user_id: str) -> None:
        await self._change("DELETE FROM user_sessions WHERE user_id = ?", user_id)

    async def sessions_of(self, user_id: str) -> int:
        found = await self._one(
            "SELECT COUNT(*) FROM user_sessions WHERE user_id = ? AND seen_at > ?",
            user_id,
            time.time() - SESSION_IDLE_SECONDS,
        )
        return int(found[0]) if found is not None else 0

    # --- failed sign-ins --------------------------------------------------------------

    async def attempt(self, name: str, address: str) -> Attempt:
        """Count one sign-in attempt against the name and the address (before the
        password is checked), and say whether to slow it down or refuse it."""
        policy, now = self.policy, time.time()
        keys = ((f"name:{name}", 1), (f"address:{address}", policy.address_factor))

        async def count(tx: Tx) -> Attempt:
            # Counters whose window has passed say nothing any more: they go, so the
            # table holds only the last window's keys, however many names are tried.
            await tx.execute("DELETE FROM sign_in_failures WHERE since < ?", (now - policy.window,))
            delay, refused_until = 0.0, None
            for key, factor in keys:
                rows = await tx.fetch(
                    "INSERT INTO sign_in_failures (key, failures, since) VALUES (?, 1, ?) "
                    "ON CONFLICT (key) DO UPDATE SET failures = sign_in_failures.failures + 1 "
                    "RETURNING failures, since",
                    (key, now),
                )
                failures, since = int(rows[0][0]), float(rows[0][1])
                before = failures - 1  # this attempt is not a failure yet
                if before >= policy.refuse_after * factor:
                    refused_until = max(refused_until or 0.0, since + policy.window)
                beyond = before - policy.slow_after * factor + 1
                if beyond > 0:
                    delay = max(delay, min(policy.max_delay, beyond * policy.delay))
            return Attempt(delay, refused_until)

        return await self._db.write(count)

    async def succeeded(self, name: str, address: str) -> None:
        """A right password: the name starts afresh, and this attempt no longer counts
        against the address (which others behind it may share)."""

        async def forget(tx: Tx) -> None:
            await tx.execute("DELETE FROM sign_in_failures WHERE key = ?", (f"name:{name}",))
            await tx.execute(
                "UPDATE sign_in_failures SET failures = failures - 1 "
                "WHERE key = ? AND failures > 0",
                (f"address:{address}",),
            )

        await self._db.write(forget)

    # --- plumbing ---------------------------------------------------------------------

    async def _one(self, sql: str, *params: Any) -> Any:
        rows = await self._db.read(lambda tx: tx.fetch(sql, params))
        return rows[0] if rows else None

    async def _change(self, sql: str, *params: Any) -> bool:
        return await self._db.write(lambda tx: tx.execute(sql, params)) > 0


async def delete_account(tx: Tx, user_id: str) -> None:
    """The account and its sessions (its chats are the caller's to remove first)."""
    await tx.execute("DELETE FROM user_sessions WHERE user_id = ?", (user_id,))
    await tx.execute("DELETE FROM users WHERE id = ?", (user_id,))
