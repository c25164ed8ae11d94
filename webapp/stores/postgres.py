"""One PostgreSQL database, one connection pool: the machinery every PostgreSQL store shares.

`PostgresStore` owns an asyncpg pool, opened lazily on the first operation
(which also creates or migrates the store's tables), and runs every operation
on a connection from it. `PostgresBacked` is the base of a store built on one.

- ``await store.transaction(fn)`` runs ``fn(conn)`` inside one transaction;
- ``await store.fetch(sql, *args)`` / ``await store.execute(sql, *args)`` are
  the one-statement forms (a statement sees one consistent state on its own).

Invariants, each named for the failure it prevents:
- a dropped connection is ridden out: when the server closes a connection
  (restart, failover, ``pg_terminate_backend``, a network reset) or rolls a
  transaction back to break a deadlock, the operation runs again on a fresh
  connection, with backoff, until ``reconnect_timeout`` has passed overall,
  then `StoreUnavailableError`. Whether a lost COMMIT took effect cannot be
  known, so **every operation must be safe to run twice**: the stores make
  their writes idempotent (a session append per run_id, a checkpoint save
  per save id) rather than retry only "what provably never committed";
- tables and their version move together: a schema is created or migrated in
  the transaction that records it in ``schema_versions``, under one
  transaction-level advisory lock, so processes starting at once neither
  collide in ``CREATE TABLE IF NOT EXISTS`` nor migrate twice;
- a database written by a newer release is refused, never downgraded;
- no password in messages: errors name the DSN with its password masked.

Two things a caller can set for the operations of the current task:
- a **lock connection** (`pinned`): the connection that holds the task's lock
  (the web app's chat lock, on several processes). Every operation of that
  task on the same database runs on it, so losing it -- which frees the lock
  on the server -- also ends the work under the lock: the next operation
  raises `LockLostError` instead of going on, unlocked, on another connection,
  and one in flight is rolled back with the connection;
- a **fence** (`fenced`): a condition each write checks in its own
  transaction, holding what it reads until the write commits. The web app
  fences a run's writes with its lease, so a stalled owner whose run was
  taken over gets `FencedOffError` instead of writing over the new owner.

Advisory lock keys are pairs ``(hashtext(<purpose>), <key>)``; the purposes in
use are listed in `LOCK_PURPOSES` so later code picks a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

import asyncpg

from webapp.stores.migrations import Schema, SchemaVersionError
from webapp.stores.tx import PostgresTx

__all__ = [
    "LOCK_PURPOSES",
    "Fence",
    "FencedOffError",
    "LockLostError",
    "PostgresBacked",
    "PostgresStore",
    "SchemaVersionError",
    "StoreUnavailableError",
    "connection_gone",
    "connection_lost",
    "fenced",
    "is_transient",
    "pinned",
    "pinned_connection",
    "redact_dsn",
]

logger = logging.getLogger("webapp.stores.postgres")

T = TypeVar("T")
ConnFn = Callable[[asyncpg.Connection], Awaitable[T]]

LOCK_PURPOSES = ("webapp.schema", "webapp.session", "webapp.chat")

_BACKOFF_START = 0.01
_BACKOFF_MAX = 0.5


class StoreUnavailableError(ConnectionError):
    """The database stayed unreachable past ``reconnect_timeout``."""


class LockLostError(RuntimeError):
    """The connection holding the current task's lock is gone, and the lock with it."""


class FencedOffError(RuntimeError):
    """A write's fence no longer holds: the write was refused, nothing of it stored."""


@dataclass(frozen=True)
class Fence:
    """A condition every write of the current task checks in the write's own transaction.

    ``sql`` returns a row while the writer may write and locks it (``FOR SHARE``),
    so whoever would change it waits for the write to commit, and a write after
    the change finds no row. ``holder`` names the writer in the error.
    """

    sql: str
    args: tuple[Any, ...]
    holder: str

    async def check(self, conn: asyncpg.Connection) -> None:
        if await conn.fetchval(self.sql, *self.args) is None:
            raise FencedOffError(
                f"{self.holder} no longer holds what its writes are fenced by (another "
                "took it over); this write was refused and nothing of it was stored"
            )


_fence: ContextVar[Fence | None] = ContextVar("webapp_postgres_fence", default=None)
# (task, dsn, connection): only that task's operations on that database use it.
_pinned: ContextVar[tuple[asyncio.Task[Any] | None, str, asyncpg.Connection] | None] = ContextVar(
    "webapp_postgres_pinned", default=None
)


@contextlib.contextmanager
def fenced(fence: Fence) -> Iterator[None]:
    """Every store write in the block, and in tasks started in it, checks ``fence`` first."""
    token = _fence.set(fence)
    try:
        yield
    finally:
        _fence.reset(token)


@contextlib.contextmanager
def pinned(dsn: str, conn: asyncpg.Connection) -> Iterator[None]:
    """This task's store operations on ``dsn`` run on ``conn`` in the block.

    Tasks started in the block do not inherit it: a connection runs one
    statement at a time, and what they do is not the work under the lock.
    """
    token = _pinned.set((asyncio.current_task(), dsn, conn))
    try:
        yield
    finally:
        _pinned.reset(token)


def pinned_connection(dsn: str) -> asyncpg.Connection | None:
    """The connection the current task's operations on ``dsn`` are pinned to, if any."""
    found = _pinned.get()
    if found is None or found[0] is not asyncio.current_task() or found[1] != dsn:
        return None
    return found[2]


def redact_dsn(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***``, fit for messages and logs."""
    try:
        parts = urllib.parse.urlsplit(dsn)
    except ValueError:
        return "<unparsable DSN>"
    if parts.password is None:
        return dsn
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def is_transient(exc: BaseException) -> bool:
    """True when running the operation again on a new connection may well succeed.

    The exceptions an error was raised while handling count too: a dead
    connection often surfaces as "connection is closed" from the ROLLBACK
    that followed the real error.
    """
    return _in_chain(exc, _transient_alone)


def connection_lost(exc: BaseException) -> bool:
    """True when ``exc`` (or what it was raised while handling) says the connection is gone."""
    return _in_chain(exc, _lost_alone)


def _in_chain(exc: BaseException | None, test: Callable[[BaseException], bool]) -> bool:
    for _ in range(5):
        if exc is None or isinstance(exc, _FINAL):
            return False
        if test(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _transient_alone(exc: BaseException) -> bool:
    return _lost_alone(exc) or isinstance(
        exc,
        (
            asyncpg.exceptions.TransactionRollbackError,  # 40xxx: serialization, deadlock
            asyncpg.exceptions.TooManyConnectionsError,
        ),
    )


def _lost_alone(exc: BaseException) -> bool:
    if isinstance(exc, (asyncpg.QueryCanceledError, StoreUnavailableError)):
        # statement_timeout or a cancel: running it again waits as long; and
        # StoreUnavailableError has waited out its timeout already.
        return False
    return isinstance(
        exc,
        (
            asyncpg.PostgresConnectionError,  # 08xxx: the connection is gone
            asyncpg.exceptions.OperatorInterventionError,  # 57Pxx: shutdown, restart
            OSError,  # refused, reset, broken pipe (ConnectionError is one)
            asyncio.TimeoutError,  # connect timeout
        ),
    )


# Never worth running again, whatever they were raised while handling: the timeout
# has been waited out, the lock is gone, the fence refuses.
_FINAL = (StoreUnavailableError, LockLostError, FencedOffError)


class PostgresStore:
    """A lazily opened asyncpg pool on one database, with the store's schema applied.

    Example -- a table of one's own in the app's database::

        schema = "CREATE TABLE IF NOT EXISTS chats (id TEXT PRIMARY KEY, title TEXT);"
        chats = PostgresStore(dsn, schema_name="chats", schema_version=1, schema_sql=schema)
        await chats.execute("INSERT INTO chats VALUES ($1, $2) ON CONFLICT DO NOTHING", cid, t)
        rows = await chats.fetch("SELECT id, title FROM chats ORDER BY id")

        async def rename(conn: asyncpg.Connection) -> str:  # several statements, one transaction
            return await conn.execute("UPDATE chats SET title = $1 WHERE id = $2", title, cid)

        await chats.transaction(rename)
        await chats.close()

    Operations are retried on a new connection when the old one is lost (see
    the module docstring), so ``fn`` must be safe to run twice and keep no
    state outside the connection it is given.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema_name: str,
        schema_version: int,
        schema_sql: str,
        migrations: Mapping[int, str] | None = None,
        max_connections: int = 10,
        reconnect_timeout: float = 10.0,
    ) -> None:
        if not isinstance(dsn, str) or not dsn.startswith(("postgresql://", "postgres://")):
            shown = redact_dsn(dsn) if isinstance(dsn, str) else repr(dsn)
            raise ValueError(
                f"dsn must be a postgresql:// URL such as "
                f"'postgresql://user:password@host:5432/dbname', got {shown!r}"
            )
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections!r}")
        if reconnect_timeout <= 0:
            raise ValueError(
                f"reconnect_timeout must be a positive number of seconds, got {reconnect_timeout!r}"
            )
        self.dsn = dsn
        self.schema = Schema(schema_name, schema_version, schema_sql, migrations or {})
        self.max_connections = max_connections
        self.reconnect_timeout = reconnect_timeout
        self._pool: asyncpg.Pool | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None
        self._users: set[asyncio.Future[None]] = set()  # operations running on the pool
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.schema.name!r} dsn={redact_dsn(self.dsn)!r}>"

    # --- public API -------------------------------------------------------------

    async def transaction(self, fn: ConnFn[T]) -> T:
        """Run ``fn(conn)`` in one committed transaction (run again if the connection drops),
        after the current fence's check (`fenced`), if there is one."""
        fence = _fence.get()

        async def in_transaction(conn: asyncpg.Connection) -> T:
            async with conn.transaction():
                if fence is not None:
                    await fence.check(conn)
                return await fn(conn)

        return await self._run(in_transaction)

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        """Rows of one statement (a read: never fenced)."""
        return await self._run(lambda conn: conn.fetch(sql, *args))  # type: ignore[no-any-return]

    async def execute(self, sql: str, *args: Any) -> str:
        """Run one statement (its own transaction); returns the server's status tag."""

        async def statement(conn: asyncpg.Connection) -> str:
            return str(await conn.execute(sql, *args))

        if _fence.get() is not None:  # the check and the statement in one transaction
            return await self.transaction(statement)
        return await self._run(statement)

    async def close(self) -> None:
        """Wait for operations in flight, close the pool; idempotent, a later call reopens."""
        async with self._opening():
            pool, loop, users = self._pool, self._pool_loop, self._users
            self._pool = self._pool_loop = None
            self._users = set()
        if pool is None:
            return
        if loop is asyncio.get_running_loop():
            if users:  # operations already under way finish on this pool
                await asyncio.wait(users)
            await pool.close()
        else:
            _abandon(pool)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- running an operation -----------------------------------------------------

    async def _run(self, fn: ConnFn[T]) -> T:
        deadline: float | None = None
        tries = 0
        while True:
            pool = await self._open_pool()
            # Registered with no await since the pool was taken: a close()
            # that swaps the pool out afterwards sees this operation and waits.
            users, done = self._users, asyncio.get_running_loop().create_future()
            users.add(done)
            held = pinned_connection(self.dsn)
            try:
                if held is not None:
                    return await _on_held(held, fn)
                async with pool.acquire() as conn:
                    return await fn(conn)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if connection_lost(exc):
                    # The other idle connections most likely died with this one
                    # (a restart): replace them all rather than fail on each in turn.
                    await pool.expire_connections()
                now = time.monotonic()
                deadline = deadline or now + self.reconnect_timeout
                if now >= deadline:
                    raise StoreUnavailableError(self._unavailable(exc)) from exc
                tries += 1
                delay = min(_BACKOFF_MAX, _BACKOFF_START * 2**tries, deadline - now)
                logger.warning(
                    "PostgreSQL connection to %s lost (%s: %s); retrying in %.2f s",
                    redact_dsn(self.dsn),
                    type(exc).__name__,
                    exc,
                    delay,
                )
            finally:
                users.discard(done)
                done.set_result(None)
            await asyncio.sleep(delay)

    def _unavailable(self, exc: BaseException) -> str:
        return (
            f"PostgreSQL at {redact_dsn(self.dsn)} stayed unreachable for more than "
            f"{self.reconnect_timeout:g} s ({type(exc).__name__}: {exc}). The operation may "
            "or may not have taken effect: check that the server is up and reachable, then "
            "retry (every store operation is safe to run twice)."
        )

    # --- opening --------------------------------------------------------------------

    def _opening(self) -> asyncio.Lock:
        """A lock serializing open and close, made for the running event loop."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    async def _open_pool(self) -> asyncpg.Pool:
        loop = asyncio.get_running_loop()
        if self._pool is not None and self._pool_loop is loop:
            return self._pool
        async with self._opening():
            if self._pool is not None and self._pool_loop is not loop:
                # Left behind by an event loop that has ended: it can only be dropped.
                _abandon(self._pool)
                self._pool = self._pool_loop = None
                self._users = set()
            if self._pool is None:
                self._pool = await self._connect()
                self._pool_loop = loop
            return self._pool

    async def _connect(self) -> asyncpg.Pool:
        """A new pool with the schema applied, riding out a server that is not up yet."""
        where = redact_dsn(self.dsn)
        deadline = time.monotonic() + self.reconnect_timeout
        tries = 0
        while True:
            pool: asyncpg.Pool | None = None
            try:
                pool = await asyncpg.create_pool(
                    self.dsn,
                    min_size=1,
                    max_size=self.max_connections,
                    server_settings=self._server_settings(),
                )
                async with pool.acquire() as conn, conn.transaction():
                    await self.schema.apply(PostgresTx(conn), where)
                return pool
            except BaseException as exc:
                if pool is not None:
                    pool.terminate()
                now = time.monotonic()
                if not isinstance(exc, Exception) or not is_transient(exc):
                    raise
                if now >= deadline:
                    raise StoreUnavailableError(self._unavailable(exc)) from exc
                logger.warning("cannot connect to PostgreSQL at %s (%s); retrying", where, exc)
            tries += 1
            await asyncio.sleep(min(_BACKOFF_MAX, _BACKOFF_START * 2**tries, deadline - now))

    def _server_settings(self) -> dict[str, str]:
        # Settings in the DSN's query (application_name, search_path ...) win.
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.dsn).query)
        return {} if "application_name" in query else {"application_name": "webapp"}


def connection_gone(conn: asyncpg.Connection) -> bool:
    """True when ``conn`` is closed -- or, taken from a pool, was taken back by it
    because its connection died (its proxy then refuses every call)."""
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:
        return True


async def _on_held(conn: asyncpg.Connection, fn: ConnFn[T]) -> T:
    """``fn`` on the connection that holds the task's lock; never on another one."""
    if connection_gone(conn):
        raise LockLostError("the connection holding this task's lock was closed")
    try:
        return await fn(conn)
    except Exception as exc:
        if connection_lost(exc) or connection_gone(conn):
            raise LockLostError(
                f"the connection holding this task's lock was lost ({type(exc).__name__}: "
                f"{exc}); the server released the lock with it, so the work under it stops"
            ) from exc
        raise


def _abandon(pool: asyncpg.Pool) -> None:
    """Drop a pool whose event loop is gone; its sockets close with the process."""
    try:
        pool.terminate()
    except RuntimeError:  # "Event loop is closed": nothing more can be done for it
        pass


class PostgresBacked:
    """Base of a store whose tables live in one `PostgresStore`: the lifecycle, written once.

    A subclass names its schema in ``SCHEMA_NAME``, ``SCHEMA_VERSION`` and
    ``SCHEMA_SQL`` (plus ``MIGRATIONS``: old version -> the SQL that upgrades
    it by one) and talks to ``self._store``.
    """

    SCHEMA_NAME: str
    SCHEMA_VERSION: int
    SCHEMA_SQL: str
    MIGRATIONS: ClassVar[Mapping[int, str]] = {}

    def __init__(
        self, dsn: str, *, max_connections: int = 10, reconnect_timeout: float = 10.0
    ) -> None:
        self._store = PostgresStore(
            dsn,
            schema_name=self.SCHEMA_NAME,
            schema_version=self.SCHEMA_VERSION,
            schema_sql=self.SCHEMA_SQL,
            migrations=self.MIGRATIONS,
            max_connections=max_connections,
            reconnect_timeout=reconnect_timeout,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact_dsn(self._store.dsn)!r})"

    async def close(self) -> None:
        """Wait for operations in flight and close the pool; idempotent, a later call reopens."""
        await self._store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
