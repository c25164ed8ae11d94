"""Several app processes on one PostgreSQL database (SPEC §9): who runs a run, and its events.

`PostgresCluster` is the `webapp.stores.cluster.Cluster` of several processes
(one process alone has the `LocalCluster` of `webapp.web.live.local_cluster`).
Any number of processes share the database, and this module is how they agree,
with the tables it needs (`CLUSTER_TABLES`, created with the chat tables):

- **Leases** (``run_leases``): a run is executed by the process whose lease on
  it is unexpired -- by the database's clock (``now()``), so clock skew between
  hosts does not matter. The owner renews its leases every `LeaseTimes.renew`;
  a lease not renewed for `LeaseTimes.seconds` is expired, and any process that
  finds a run still owed with no live lease claims it (one conditional
  upsert: exactly one claimant wins) and resumes it from its checkpoint. An
  owner that could not renew in time cancels its runs itself, so two
  processes never execute one run at once. A graceful shutdown deletes its
  leases and wakes the others at once.
- **Run events** (``run_events``): the owner writes every record of a run's
  log (the same seq, SSE event name and HTML fragment its own clients get,
  plus the change to the reply as JSON), batched every `FLUSH_SECONDS`, so any
  process rebuilds the run's log and live reply and streams it with the same
  positions: a reconnect that lands on another process continues with no gap
  and no duplicate. Records are keyed by the attempt's epoch, so a takeover
  starts a new log and old positions read as stale.
- **Wake-ups**: ``NOTIFY`` on one channel per schema tells the others that
  events were written, that a stop was requested, or that runs were handed
  over. Nothing depends on a notification arriving: followers also poll, and
  leases are scanned on a timer.
- **Fencing**: the lease's epoch is the fencing token of every write a run
  makes -- its checkpoint saves, its session append and chat row updates at
  the end (each checks the lease in its own transaction, `fence`), its run
  events (inserted only while the lease is the writer's). An owner that
  stalled past its lease and wakes after another process took the run over
  can therefore write nothing: its next write raises `FencedOffError`, which
  stops the run there without recording anything (`webapp.web.live.runs`).
- **Chat locks**: an advisory lock per chat, held for a chat operation on a
  connection of its own, which is also the connection the operation's
  database work runs on (`webapp.stores.postgres.pinned`). So an operation and
  a run's final bookkeeping never interleave, whichever processes they run
  on; and if that connection is lost, which frees the lock on the server, the
  work under it is rolled back and stops at its next statement
  (`LockLostError`) instead of going on unlocked beside the next holder.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import asyncpg

from webapp.stores.cluster import EventRow, LeaseTimes
from webapp.stores.postgres import (
    Fence,
    connection_gone,
    fenced,
    pinned,
    pinned_connection,
    redact_dsn,
)

__all__ = ["CLUSTER_TABLES", "EventRow", "PostgresCluster"]

logger = logging.getLogger("webapp.stores.postgres_cluster")

FLUSH_SECONDS = 0.02  # events are written in batches at most this far apart
FLUSH_TIMEOUT = 10.0  # a flush gives up after this long (the database is unreachable)
LOCK_CONNECTIONS = 8  # chat operations holding their lock at once; more wait for one
EVENTS_KEPT_SECONDS = 300  # a finished run's events stay this long for late readers
_MAX_PAYLOAD = 7000  # bytes of run ids in one notification ("*": every run)


_CLAIM = """
INSERT INTO run_leases (run_id, chat_id, owner, epoch, expires_at)
VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))
ON CONFLICT (run_id) DO UPDATE
    SET owner = excluded.owner, epoch = excluded.epoch, expires_at = excluded.expires_at
    WHERE run_leases.expires_at < now() OR run_leases.owner = excluded.owner
RETURNING run_id
"""

# Runs a chat still owes whose lease is missing or expired: another process's to take.
# Not those waiting for a tool approval (``paused_runs``): a decision resumes them.
_UNOWNED = """
SELECT c.id, c.active_run_id FROM chats c
LEFT JOIN run_leases l ON l.run_id = c.active_run_id AND l.expires_at >= now()
WHERE c.active_run_id IS NOT NULL AND l.run_id IS NULL
AND NOT EXISTS (SELECT 1 FROM paused_runs p WHERE p.run_id = c.active_run_id)
"""

# Renewed only where this process holds the very attempt ($2, $3): rows locked in
# run_id order, as `_WRITE_EVENTS` locks them, so the two never deadlock.
_RENEW = """
WITH mine AS (
    SELECT l.run_id FROM run_leases l
    JOIN unnest($2::text[], $3::text[]) AS a (run_id, epoch)
        ON a.run_id = l.run_id AND a.epoch = l.epoch
    WHERE l.owner = $1 ORDER BY l.run_id FOR UPDATE OF l
)
UPDATE run_leases SET expires_at = now() + make_interval(secs => $4)
FROM mine WHERE run_leases.run_id = mine.run_id
RETURNING run_leases.run_id
"""

# A run's writes go through while its attempt holds the lease, and the lease row stays
# share-locked until they commit: a takeover (which updates the row) waits for them.
_FENCE = "SELECT 1 FROM run_leases WHERE run_id = $1 AND owner = $2 AND epoch = $3 FOR SHARE"

_LOCK = "SELECT pg_advisory_lock(hashtext('webapp.chat'), hashtext($1))"
_UNLOCK = "SELECT pg_advisory_unlock(hashtext('webapp.chat'), hashtext($1))"

# Only the records of attempts that hold their lease (the fence, for a whole batch).
_WRITE_EVENTS = """
WITH batch (run_id, epoch, seq, event, data, delta) AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::text[], $6::text[])
), held AS (
    SELECT l.run_id, l.epoch FROM run_leases l
    WHERE l.owner = $7 AND (l.run_id, l.epoch) IN (SELECT run_id, epoch FROM batch)
    ORDER BY l.run_id FOR SHARE OF l
)
INSERT INTO run_events (run_id, epoch, seq, event, data, delta)
SELECT b.* FROM batch b JOIN held h ON h.run_id = b.run_id AND h.epoch = b.epoch
ON CONFLICT DO NOTHING
"""


# The run leases and event log, on PostgreSQL only. Created with the chat tables
# (`webapp.chats.store`), so the chat database's migrations stay in one place.
CLUSTER_TABLES = """
CREATE TABLE IF NOT EXISTS run_leases (
    run_id     TEXT PRIMARY KEY,
    chat_id    TEXT NOT NULL,
    owner      TEXT NOT NULL,
    epoch      TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS run_leases_by_owner ON run_leases (owner);
CREATE TABLE IF NOT EXISTS run_events (
    run_id     TEXT NOT NULL,
    epoch      TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    event      TEXT NOT NULL,
    data       TEXT NOT NULL,
    delta      TEXT,
    written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, epoch, seq)
);
CREATE INDEX IF NOT EXISTS run_events_by_time ON run_events (written_at);
"""


class PostgresCluster:
    """This process's view of the others: its leases, its event writes, its wake-ups.

    ``owner`` names this process in the lease table; ``lease`` is how long a lease
    lasts unrenewed (`LeaseTimes`). `start` opens the
    connections (chat locks have a pool of their own); the callbacks run on
    this process's loop when another process writes events
    (``on_events(run_id)``), asks for a stop (``on_stop(run_id)``) or hands
    runs over (``on_handover()``).
    """

    def __init__(
        self,
        dsn: str,
        owner: str,
        lease: LeaseTimes | None = None,
        *,
        events: int = 4,
        locks: int = LOCK_CONNECTIONS,
    ) -> None:
        self.dsn = dsn
        self.owner = owner
        self.lease = lease or LeaseTimes()
        self._sizes = (events, locks)  # connections of the two pools (--db-pool-size)
        self.on_events: Callable[[str], None] = lambda run_id: None
        self.on_stop: Callable[[str], None] = lambda run_id: None
        self.on_handover: Callable[[], None] = lambda: None
        self._pool: asyncpg.Pool | None = None
        self._listener: asyncpg.Connection | None = None
        self._locks: asyncpg.Pool | None = None
        self._channel = ""
        self._pending: list[tuple[str, str, int, str, str, str | None]] = []
        self._flush_wanted = asyncio.Event()
        self._flushed = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"PostgresCluster({redact_dsn(self.dsn)!r}, owner={self.owner!r})"

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        self._pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self._sizes[0])
        schema = await self._pool.fetchval("SELECT current_schema()")
        digest = hashlib.sha1(str(schema).encode()).hexdigest()[:16]
        self._channel = f"webapp_{digest}"
        self._locks = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self._sizes[1])
        await self._listen()
        self._writer = asyncio.get_running_loop().create_task(self._write_events())

    async def _listen(self) -> None:
        if self._listener is not None and not self._listener.is_closed():
            return
        self._listener = await asyncpg.connect(self.dsn)
        await self._listener.add_listener(self._channel, self._notified)

    async def keep_listening(self) -> None:
        """Reopen the listening connection if it was lost (called on the scan timer)."""
        try:
            await self._listen()
        except (OSError, asyncpg.PostgresError) as exc:
            logger.warning("cannot listen for other processes (polling meanwhile): %s", exc)

    async def close(self) -> None:
        if self._writer is not None:
            try:
                await self.flush()
            except TimeoutError:
                logger.warning("run events not written at shutdown: %d", len(self._pending))
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        if self._listener is not None and not self._listener.is_closed():
            await self._listener.close()
        self._listener = None
        if self._locks is not None:
            try:  # an operation still holding its lock has seconds to finish
                await asyncio.wait_for(self._locks.close(), FLUSH_TIMEOUT)
            except TimeoutError:
                self._locks.terminate()
            self._locks = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("the cluster connection is not started (PostgresCluster.start)")
        return self._pool

    # --- wake-ups --------------------------------------------------------------------

    def _notified(self, conn: object, pid: int, channel: str, payload: str) -> None:
        kind, _, arg = payload.partition(" ")
        if kind == "e":
            for run_id in arg.split(","):
                self.on_events(run_id)
        elif kind == "s":
            self.on_stop(arg)
        elif kind == "h":
            self.on_handover()

    async def notify(self, payload: str) -> None:
        await self.pool.execute("SELECT pg_notify($1, $2)", self._channel, payload)

    # --- chat locks ------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def chat_lock(self, key: str) -> AsyncIterator[None]:
        """Hold ``key``'s lock across processes for the block, whose store operations
        run on the connection holding it (the caller holds this process's own lock for
        ``key``, so no two tasks here wait for one key). A lock taken inside another
        lock of the same task goes on that one's connection."""
        held = pinned_connection(self.dsn)
        if held is not None:
            await held.execute(_LOCK, key)
            try:
                yield
            finally:
                await _unlock(held, key)
            return
        if self._locks is None:
            raise RuntimeError("the cluster connection is not started (PostgresCluster.start)")
        # Released to the pool, a connection is reset, which drops any lock it still has.
        async with self._locks.acquire() as conn:
            await conn.execute(_LOCK, key)
            try:
                with pinned(self.dsn, conn):
                    yield
            finally:
                await _unlock(conn, key)

    # --- fencing ---------------------------------------------------------------------

    def fence(self, run_id: str, epoch: str) -> Fence:
        """What every write of attempt ``epoch`` of ``run_id`` checks: it holds the lease."""
        return Fence(_FENCE, (run_id, self.owner, epoch), f"attempt {epoch} of run {run_id}")

    def fenced(self, run_id: str, epoch: str) -> contextlib.AbstractContextManager[None]:
        """Each write in the block (and in tasks it starts) is refused with
        `FencedOffError` once attempt ``epoch`` no longer holds the lease."""
        return fenced(self.fence(run_id, epoch))

    # --- leases ----------------------------------------------------------------------

    async def claim(self, run_id: str, chat_id: str, epoch: str) -> bool:
        """Take the lease on ``run_id`` if nobody holds a live one; True if this process has it."""
        found = await self.pool.fetchval(
            _CLAIM, run_id, chat_id, self.owner, epoch, self.lease.seconds
        )
        return found is not None

    async def renew(self, attempts: Mapping[str, str]) -> tuple[set[str], set[str]]:
        """Extend this process's leases on ``attempts`` (run id -> epoch); returns the
        run ids (still held, stop requested)."""
        if not attempts:
            return set(), set()
        run_ids = list(attempts)
        async with self.pool.acquire() as conn:
            held = await conn.fetch(
                _RENEW, self.owner, run_ids, [attempts[r] for r in run_ids], self.lease.seconds
            )
            stops = await conn.fetch(
                "SELECT stop_requested_run_id FROM chats WHERE stop_requested_run_id = "
                "ANY($1::text[]) AND active_run_id = stop_requested_run_id",
                run_ids,
            )
        return {r[0] for r in held}, {r[0] for r in stops}

    async def release(self, run_id: str, epoch: str) -> None:
        """Give up attempt ``epoch``'s lease on ``run_id`` (a later attempt's stays)."""
        await self.pool.execute(
            "DELETE FROM run_leases WHERE run_id = $1 AND owner = $2 AND epoch = $3",
            run_id,
            self.owner,
            epoch,
        )

    async def hand_over(self) -> int:
        """Give up every lease of this process at once and wake the others to take them."""
        with contextlib.suppress(TimeoutError):  # once the leases go, their events are refused
            await self.flush()
        status = await self.pool.execute("DELETE FROM run_leases WHERE owner = $1", self.owner)
        await self.notify("h")
        return int(status.rpartition(" ")[2] or 0)

    async def unowned(self) -> list[tuple[str, str]]:
        """(chat id, run id) of runs still owed that no live lease covers."""
        return [(r[0], r[1]) for r in await self.pool.fetch(_UNOWNED)]

    async def lease_epoch(self, run_id: str) -> str | None:
        """The epoch of the attempt that holds ``run_id``'s lease (expired or not)."""
        found = await self.pool.fetchval("SELECT epoch FROM run_leases WHERE run_id = $1", run_id)
        return str(found) if found is not None else None

    async def request_stop(self, run_id: str) -> None:
        await self.notify(f"s {run_id}")

    # --- run events ------------------------------------------------------------------

    def write(
        self, run_id: str, epoch: str, seq: int, event: str, data: str, delta: dict[str, Any]
    ) -> None:
        """Queue one log record for the next batch (written within `FLUSH_SECONDS`)."""
        self._pending.append((run_id, epoch, seq, event, data, json.dumps(delta)))
        self._flushed.clear()
        self._flush_wanted.set()

    async def flush(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Return once every record queued so far is in the table (TimeoutError when
        the database does not take them in time; they stay queued)."""
        if self._pending or not self._flushed.is_set():
            self._flush_wanted.set()
            await asyncio.wait_for(self._flushed.wait(), timeout)

    async def _write_events(self) -> None:
        self._flushed.set()
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            rows, self._pending = self._pending, []
            if rows:
                try:
                    await self._insert(rows)
                except (OSError, asyncpg.PostgresError) as exc:
                    logger.warning("could not write run events (retrying): %s", exc)
                    self._pending[:0] = rows
                    self._flush_wanted.set()
                    await asyncio.sleep(0.5)
                    continue
            if not self._pending:
                self._flushed.set()
            await asyncio.sleep(FLUSH_SECONDS)

    async def _insert(self, rows: list[tuple[str, str, int, str, str, str | None]]) -> None:
        columns = list(zip(*rows, strict=True))
        runs = ",".join(sorted(set(columns[0])))
        if len(runs) > _MAX_PAYLOAD:  # a notification carries at most 8000 bytes
            runs = "*"
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(_WRITE_EVENTS, *(list(c) for c in columns), self.owner)
            await conn.execute("SELECT pg_notify($1, $2)", self._channel, "e " + runs)

    async def events(self, run_id: str, epoch: str, after: int) -> list[EventRow]:
        rows = await self.pool.fetch(
            "SELECT seq, event, data, delta FROM run_events "
            "WHERE run_id = $1 AND epoch = $2 AND seq > $3 ORDER BY seq",
            run_id,
            epoch,
            after,
        )
        return [
            EventRow(int(r[0]), str(r[1]), str(r[2]), json.loads(r[3]) if r[3] else None)
            for r in rows
        ]

    async def forget_old_events(self) -> None:
        """Delete the events of attempts that hold no lease any more, once they are old."""
        await self.pool.execute(
            "DELETE FROM run_events e WHERE e.written_at < now() - make_interval(secs => $1) "
            "AND NOT EXISTS (SELECT 1 FROM run_leases l WHERE l.run_id = e.run_id "
            "AND l.epoch = e.epoch)",
            EVENTS_KEPT_SECONDS,
        )


async def _unlock(conn: asyncpg.Connection, key: str) -> None:
    if connection_gone(conn):
        return  # the server released the lock with the connection
    try:
        await conn.execute(_UNLOCK, key)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        # Lost now: the server releases it; else the pool's reset does.
        logger.warning("could not release the lock of %s: %s", key, exc)
