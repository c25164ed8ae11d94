"""What only the PostgreSQL stores risk: the pool's lifecycle, schema races, dropped connections.

The Session and Checkpointer contracts themselves run on PostgreSQL through
the shared conformance suites (tests/stores/conftest.py); these tests cover
the machinery under them. Each test has a schema of its own (``postgres_dsn``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from postgres import NoPostgres, find_bin_dir, missing_postgres

from webapp.stores.checkpoint import RunHead
from webapp.stores.codec import StoredDataError
from webapp.stores.postgres import (
    Fence,
    FencedOffError,
    LockLostError,
    PostgresStore,
    SchemaVersionError,
    StoreUnavailableError,
    fenced,
    pinned,
    redact_dsn,
)
from webapp.stores.postgres_checkpoint import PostgresCheckpointer
from webapp.stores.postgres_session import TAIL_SQL, PostgresSession
from webapp.stores.session import trim_output
from webapp.transcript import (
    AssistantEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
    entry_to_dict,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def raw(postgres_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection to the test's schema, beside the store's pool."""
    conn = await asyncpg.connect(postgres_dsn)
    yield conn
    await conn.close()


async def tables(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
    )
    return {r[0] for r in rows}


async def store_connections(conn: asyncpg.Connection, *, settle: bool = False) -> int:
    """How many connections the stores (application_name 'webapp') hold on the server."""
    query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'webapp'"
    count = int(await conn.fetchval(query))
    for _ in range(100 if settle else 0):
        if count == 0:
            break
        await asyncio.sleep(0.02)
        count = int(await conn.fetchval(query))
    return count


async def terminate_store_connections(conn: asyncpg.Connection) -> int:
    """Make the server drop every connection the stores hold, as a restart would."""
    return int(
        await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'webapp' AND pid <> pg_backend_pid()"
        )
    )


# --- lifecycle ---------------------------------------------------------------------------


async def test_opened_lazily_with_versions_recorded_and_data_outliving_the_instance(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    session, cp = PostgresSession(postgres_dsn), PostgresCheckpointer(postgres_dsn)
    assert await tables(raw) == set()
    await session.append("s", [UserEntry("hi"), AssistantEntry("yo")], run_id="r", meta={"m": 1})
    await cp.append("run", [UserEntry("hi")], RunHead("main", turns=1))
    await session.close()
    await cp.close()
    assert {"schema_versions", "session_segments", "checkpoint_heads"} <= await tables(raw)
    versions = dict(await raw.fetch("SELECT name, version FROM schema_versions"))
    assert versions == {"session": 1, "checkpoint": 2}  # 2: the streamed text (issue 35)

    async with PostgresSession(postgres_dsn) as again, PostgresCheckpointer(postgres_dsn) as cp2:
        assert [(s.run_id, s.meta) for s in await again.segments("s")] == [("r", {"m": 1})]
        snap = await cp2.load("run")
        assert snap is not None and snap.entries == [UserEntry("hi")] and snap.head.turns == 1


async def test_close_is_idempotent_and_a_closed_store_reopens(postgres_dsn: str) -> None:
    session = PostgresSession(postgres_dsn)
    await session.close()  # never opened
    await session.append("s", [UserEntry("1")], run_id="a")
    await session.close()
    await session.close()
    await session.append("s", [UserEntry("2")], run_id="b")
    assert await session.load("s") == [UserEntry("1"), UserEntry("2")]
    await session.close()


async def test_close_waits_for_operations_in_flight(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    session = PostgresSession(postgres_dsn)
    await session.load("s")
    writes = [
        asyncio.ensure_future(session.append("s", [UserEntry(str(i))], run_id=str(i)))
        for i in range(30)  # more than the pool's connections: some wait for one
    ]
    await asyncio.sleep(0.01)
    await session.close()
    assert await asyncio.gather(*writes) == [str(i) for i in range(30)]
    assert await raw.fetchval("SELECT count(*) FROM session_segments") == 30
    # Nothing reopened the pool behind close()'s back (backends exit a moment later).
    assert await store_connections(raw, settle=True) == 0


def test_a_store_outlives_its_event_loop(postgres_dsn: str) -> None:
    # Scripts and tests call asyncio.run more than once; the pool of an ended
    # loop cannot be used, so the next loop opens a new one.
    session = PostgresSession(postgres_dsn)
    asyncio.run(session.append("s", [UserEntry("first loop")], run_id="a"))
    assert asyncio.run(session.load("s")) == [UserEntry("first loop")]
    asyncio.run(session.close())


# --- schema ----------------------------------------------------------------------------------

SCHEMA_RACE = """
import asyncio, pathlib, sys, time
from webapp.stores.postgres_checkpoint import PostgresCheckpointer
from webapp.stores.postgres_session import PostgresSession
from webapp.transcript import UserEntry

dsn, me, folder = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])

async def main():
    (folder / f"ready-{me}").touch()
    deadline = time.monotonic() + 20
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("no start signal within 20 s")
        await asyncio.sleep(0.002)
    async with PostgresSession(dsn) as session, PostgresCheckpointer(dsn) as cp:
        await asyncio.gather(session.load("s"), cp.load("r"))
        await session.append("s", [UserEntry(me)], run_id=me)

asyncio.run(main())
"""


def test_processes_creating_the_schema_at_once_do_not_collide(
    postgres_dsn: str, tmp_path: Path
) -> None:
    names = [f"p{i}" for i in range(4)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCHEMA_RACE, postgres_dsn, name, str(tmp_path)],
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready-{n}").exists() for n in names):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        (tmp_path / "go").touch()
        outcomes = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    for proc, (_, err) in zip(procs, outcomes, strict=True):
        assert proc.returncode == 0, err

    async def check() -> None:
        async with PostgresSession(postgres_dsn) as session:
            assert sorted(s.run_id for s in await session.segments("s")) == names

    asyncio.run(check())


async def test_a_newer_schema_is_refused_and_an_older_one_migrated(postgres_dsn: str) -> None:
    def store(version: int, migrations: dict[int, str] | None = None) -> PostgresStore:
        return PostgresStore(
            postgres_dsn,
            schema_name="notes",
            schema_version=version,
            schema_sql="CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY);",
            migrations=migrations,
        )

    async with store(1) as v1:
        await v1.execute("INSERT INTO notes VALUES ('kept')")
    async with store(2) as v2:
        with pytest.raises(
            SchemaVersionError, match="no migration for 'notes' from schema version 1"
        ):
            await v2.fetch("SELECT 1")
    migrate = {1: "ALTER TABLE notes ADD COLUMN body TEXT NOT NULL DEFAULT '';"}
    async with store(2, migrate) as v2:
        assert [tuple(r) for r in await v2.fetch("SELECT id, body FROM notes")] == [("kept", "")]
    async with store(1) as old:
        with pytest.raises(SchemaVersionError, match="'notes' schema version 2, newer than"):
            await old.fetch("SELECT 1")


# --- dropped connections ---------------------------------------------------------------------


async def test_connections_dropped_by_the_server_are_re_established(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    async with PostgresSession(postgres_dsn) as session, PostgresCheckpointer(postgres_dsn) as cp:
        await asyncio.gather(
            *(session.append("s", [UserEntry(str(i))], run_id=str(i)) for i in range(8))
        )
        await cp.append("run", [UserEntry("go")], RunHead("main"))
        assert await terminate_store_connections(raw) >= 2
        await asyncio.sleep(0.05)  # let the pools see the connections close
        await session.append("s", [UserEntry("after")], run_id="after")
        await cp.append("run", [AssistantEntry("done")], RunHead("main", status="completed"))
        assert len(await session.load("s")) == 9
        snap = await cp.load("run")
        assert snap is not None and snap.entries == [UserEntry("go"), AssistantEntry("done")]


async def test_an_append_cut_off_mid_transaction_is_stored_once(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    async with PostgresSession(postgres_dsn) as session:
        await session.append("s", [UserEntry("before")], run_id="before")
        # Hold the session's write lock so the append waits inside its transaction ...
        await raw.execute("SELECT pg_advisory_lock(hashtext('webapp.session'), hashtext('s'))")
        append = asyncio.ensure_future(session.append("s", [UserEntry("cut")], run_id="cut"))
        for _ in range(200):
            waiting = await raw.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'webapp' "
                "AND wait_event_type = 'Lock'"
            )
            if waiting:
                break
            await asyncio.sleep(0.01)
        assert waiting == 1
        # ... then drop its connection: the store runs the append again.
        assert await terminate_store_connections(raw) >= 1
        await asyncio.sleep(0.1)
        await raw.execute("SELECT pg_advisory_unlock_all()")
        await asyncio.wait_for(append, 10)
        assert [s.run_id for s in await session.segments("s")] == ["before", "cut"]


# --- a task's lock connection and its fence ----------------------------------------------


async def test_work_pinned_to_a_lock_connection_runs_on_it_and_stops_when_it_is_lost(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    holder = await asyncpg.connect(postgres_dsn)
    async with PostgresSession(postgres_dsn) as session, PostgresCheckpointer(postgres_dsn) as cp:
        await session.load("s")  # the tables exist before the holder's work begins
        with pinned(postgres_dsn, holder):
            # The work is done on the connection itself, in its own committed transactions.
            await session.append("s", [UserEntry("under the lock")], run_id="first")
            assert [s.run_id for s in await session.segments("s")] == ["first"]
            # The server drops the holder (and any lock it had): the work stops there,
            # it does not go on through the pool as if nothing had happened.
            await raw.execute("SELECT pg_terminate_backend($1)", holder.get_server_pid())
            await asyncio.sleep(0.1)
            with pytest.raises(LockLostError):
                await session.append("s", [UserEntry("after the loss")], run_id="second")
            with pytest.raises(LockLostError):
                await cp.append("run", [UserEntry("after the loss")], RunHead("main"))
        # Out of the block (or in another task) the stores use their pool as ever.
        assert [s.run_id for s in await session.segments("s")] == ["first"]
        assert await cp.load("run") is None
    await holder.close()


async def test_a_task_started_under_a_pin_uses_the_pool(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    holder = await asyncpg.connect(postgres_dsn)
    store = PostgresStore(postgres_dsn, schema_name="t", schema_version=1, schema_sql="SELECT 1;")
    try:
        with pinned(postgres_dsn, holder):
            here = await store.fetch("SELECT pg_backend_pid()")
            other = await asyncio.create_task(store.fetch("SELECT pg_backend_pid()"))
        assert here[0][0] == holder.get_server_pid()
        assert other[0][0] != holder.get_server_pid()
    finally:
        await store.close()
        await holder.close()


TOKENS = "CREATE TABLE tokens (name TEXT PRIMARY KEY, epoch INTEGER NOT NULL)"
TOKEN_FENCE = Fence(
    "SELECT 1 FROM tokens WHERE name = $1 AND epoch = $2 FOR SHARE", ("run", 1), "attempt 1"
)


async def test_fenced_writes_are_refused_once_the_fence_moves_on(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    await raw.execute(TOKENS)
    await raw.execute("INSERT INTO tokens VALUES ('run', 1)")
    async with PostgresSession(postgres_dsn) as session, PostgresCheckpointer(postgres_dsn) as cp:
        with fenced(TOKEN_FENCE):
            await session.append("s", [UserEntry("while it holds")], run_id="a")
            await cp.append("run", [UserEntry("while it holds")], RunHead("main"))
            await raw.execute("UPDATE tokens SET epoch = 2")  # another attempt took over
            with pytest.raises(FencedOffError, match="attempt 1 no longer holds"):
                await session.append("s", [UserEntry("too late")], run_id="b")
            with pytest.raises(FencedOffError):
                await cp.append("run", [AssistantEntry("too late")], RunHead("main", turns=1))
            with pytest.raises(FencedOffError):
                await cp.delete("run")
            # Reads are not writes: the stale attempt may still look.
            assert [s.run_id for s in await session.segments("s")] == ["a"]
        snapshot = await cp.load("run")
        assert snapshot is not None and snapshot.entries == [UserEntry("while it holds")]
        assert snapshot.head.turns == 0


async def test_a_fenced_write_holds_off_the_change_of_its_fence_until_it_commits(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    await raw.execute(TOKENS)
    await raw.execute("INSERT INTO tokens VALUES ('run', 1)")
    store = PostgresStore(postgres_dsn, schema_name="t", schema_version=1, schema_sql="SELECT 1;")
    checked, go_on = asyncio.Event(), asyncio.Event()

    async def slow_write(conn: asyncpg.Connection) -> None:
        checked.set()  # past the fence's check, not committed yet
        await go_on.wait()
        await conn.execute("INSERT INTO tokens VALUES ('written', 0)")

    try:
        with fenced(TOKEN_FENCE):
            write = asyncio.ensure_future(store.transaction(slow_write))
        await asyncio.wait_for(checked.wait(), 10)
        # A takeover cannot slip in between the check and the commit ...
        await raw.execute("SET lock_timeout = '200ms'")
        with pytest.raises(asyncpg.LockNotAvailableError):
            await raw.execute("UPDATE tokens SET epoch = 2 WHERE name = 'run'")
        go_on.set()
        await asyncio.wait_for(write, 10)
        # ... it comes after it.
        await raw.execute("UPDATE tokens SET epoch = 2 WHERE name = 'run'")
        assert await raw.fetchval("SELECT count(*) FROM tokens WHERE name = 'written'") == 1
    finally:
        await store.close()


async def test_a_checkpoint_save_run_twice_stores_its_entries_once(postgres_dsn: str) -> None:
    # What a retry after a lost COMMIT reply does: the same save, same save id.
    async with PostgresCheckpointer(postgres_dsn) as cp:
        entries = [json.dumps(entry_to_dict(UserEntry("once")))]
        head = json.dumps(RunHead("main", turns=1).to_dict())
        await cp._save("run", entries, head, "save-1")
        await cp._save("run", entries, head, "save-1")
        await cp.append("run", [AssistantEntry("next")], RunHead("main", turns=2))
        snap = await cp.load("run")
        assert snap is not None and snap.entries == [UserEntry("once"), AssistantEntry("next")]


async def test_an_unreachable_server_fails_in_time_naming_it_without_the_password(
    postgres_cluster: object,
) -> None:
    with socket_bound() as port:  # a port nothing answers on
        dsn = f"postgresql://app:s3cret@127.0.0.1:{port}/chat"
        session = PostgresSession(dsn, reconnect_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            await session.load("s")
        assert time.monotonic() - started < 5
    assert "app:***@127.0.0.1" in str(info.value) and "s3cret" not in str(info.value)
    assert "s3cret" not in repr(session)
    assert redact_dsn("postgresql://u@h/db") == "postgresql://u@h/db"


@pytest.mark.parametrize("dsn", ["chat.db", "sqlite:///chat.db", None])
def test_a_dsn_that_is_not_a_postgresql_url_is_refused(dsn: object) -> None:
    with pytest.raises(ValueError, match="postgresql:// URL"):
        PostgresSession(dsn)  # type: ignore[arg-type]


class socket_bound:
    """A bound but never listening TCP port: connecting to it is refused."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc_info: object) -> None:
        self.sock.close()


# --- layout: what a write touches -----------------------------------------------------------


async def test_saves_never_rewrite_entries_and_rewinds_leave_earlier_rows_alone(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    async with PostgresSession(postgres_dsn) as session, PostgresCheckpointer(postgres_dsn) as cp:
        await cp.append("run", [UserEntry("go")], RunHead("main"))
        for i in range(30):
            await session.append("s", [UserEntry(f"q{i}"), AssistantEntry(f"a{i}")], run_id=str(i))
        await raw.execute(
            """
            CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
                $$ BEGIN RAISE EXCEPTION 'row rewritten: %', TG_ARGV[0]; END $$;
            CREATE TRIGGER frozen BEFORE UPDATE OR DELETE ON checkpoint_entries
                FOR EACH ROW EXECUTE FUNCTION refuse('checkpoint entry');
            CREATE TRIGGER early BEFORE UPDATE OR DELETE ON session_segments
                FOR EACH ROW WHEN (old.seq < 30) EXECUTE FUNCTION refuse('early segment');
            """
        )
        for turn in range(1, 15):
            await cp.append(
                "run",
                [ToolCallEntry(f"c{turn}", "t", "{}"), ToolResultEntry(f"c{turn}", "ok")],
                RunHead("main", turns=turn),
            )
        assert await session.rewind("s", keep_entries=59) == 1
        snap = await cp.load("run")
    assert snap is not None and len(snap.entries) == 29 and snap.head.turns == 14
    rows = await raw.fetch("SELECT first_entry, entry_count FROM session_segments ORDER BY seq")
    assert [tuple(r) for r in rows] == [(2 * i, 2) for i in range(29)] + [(58, 1)]
    # A rewind finds its tail through the index on each run's end, not by a scan.
    await raw.execute("SET enable_seqscan = off")
    plan = "\n".join(r[0] for r in await raw.fetch("EXPLAIN " + TAIL_SQL, "s", 57))
    assert "session_segments_end" in plan, plan


# --- corrupt rows raise, naming the row -------------------------------------------------------


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("entries_json", "not json", "entries_json"),
        ("entries_json", '[{"type": "alien", "text": "x"}]', "alien"),
        ("meta_json", "{broken", "meta_json"),
    ],
)
async def test_an_undecodable_segment_raises_naming_the_row(
    postgres_dsn: str, raw: asyncpg.Connection, column: str, value: str, message: str
) -> None:
    async with PostgresSession(postgres_dsn) as session:
        await session.append("s", [UserEntry("fine")], run_id="good")
        await session.append("s", [UserEntry("soon bad")], run_id="bad")
        await raw.execute(f"UPDATE session_segments SET {column} = $1 WHERE run_id = 'bad'", value)
        with pytest.raises(StoredDataError, match=f"seq=2, run_id='bad'.*{message}"):
            await session.segments("s")


async def test_an_undecodable_checkpoint_raises_naming_the_row(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    async with PostgresCheckpointer(postgres_dsn) as cp:
        await cp.append("run", [UserEntry("a"), UserEntry("b")], RunHead("main"))
        await raw.execute(
            "UPDATE checkpoint_entries SET entry_json = '{\"type\": 7}' WHERE idx = 1"
        )
        with pytest.raises(StoredDataError, match="run_id='run', idx=1"):
            await cp.load("run")
        await raw.execute("DELETE FROM checkpoint_entries WHERE idx = 0")
        with pytest.raises(StoredDataError, match="entries 0..1"):
            await cp.load("run")
        await raw.execute("UPDATE checkpoint_heads SET head_json = '[]'")
        with pytest.raises(StoredDataError, match="checkpoint_heads row for run 'run'"):
            await cp.load("run")


async def test_a_head_stored_without_finish_reason_loads(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    async with PostgresCheckpointer(postgres_dsn) as cp:
        await cp.append("run", [UserEntry("a")], RunHead("main", finish_reason="length"))
        old = json.loads(await raw.fetchval("SELECT head_json FROM checkpoint_heads"))
        assert old.pop("finish_reason") == "length"
        await raw.execute("UPDATE checkpoint_heads SET head_json = $1", json.dumps(old))
        snapshot = await cp.load("run")
        assert snapshot is not None and snapshot.head.finish_reason is None


async def test_bad_input_fails_before_any_connection_is_opened(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    session, cp = PostgresSession(postgres_dsn), PostgresCheckpointer(postgres_dsn)
    with pytest.raises(ValueError, match="meta must be JSON-serializable"):
        await session.append("s", [UserEntry("x")], run_id="r", meta={"f": object()})
    with pytest.raises(TypeError, match="not a transcript entry"):
        await session.append("s", ["not an entry"], run_id="r")  # type: ignore[list-item]
    with pytest.raises(ValueError, match="not JSON-serializable"):
        await cp.append("run", [], RunHead("main", context_state={"f": object()}))
    assert await tables(raw) == set()


async def test_text_columns_keep_nul_characters_and_meta_key_order(postgres_dsn: str) -> None:
    # Why TEXT and not JSONB: JSONB refuses \u0000 and sorts object keys.
    async with PostgresSession(postgres_dsn) as session:
        output = "binary\x00output"
        meta = {"zeta": 1, "alpha": 2, "mid": {"b": 1, "a": 2}}
        await session.append("s", [ToolResultEntry("c", output)], run_id="r", meta=meta)
        (segment,) = await session.segments("s")
        assert segment.entries == [ToolResultEntry("c", output)]
        assert json.dumps(segment.meta) == json.dumps(meta)


# --- the test cluster itself ------------------------------------------------------------------


def test_without_postgresql_its_tests_skip_but_fail_under_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("WEBAPP_PG_BIN", raising=False)
    with pytest.raises(NoPostgres, match="apt-get install -y postgresql") as info:
        find_bin_dir(str(tmp_path / "*" / "bin"))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no PostgreSQL server binaries"):
        missing_postgres(str(info.value))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: the PostgreSQL tests must run"):
        missing_postgres(str(info.value))


async def test_trim_passes_over_entries_it_does_not_know_and_keeps_their_keys(
    postgres_dsn: str, raw: asyncpg.Connection
) -> None:
    long = "o" * 2_000
    async with PostgresSession(postgres_dsn) as session:
        await session.append("s", [UserEntry("later")], run_id="newer")
        await session.append(
            "s", [ToolCallEntry("c1", "f", "{}"), ToolResultEntry("c1", long)], run_id="old"
        )
        await session.append("s", [UserEntry("last")], run_id="last")
        alien = [{"type": "image", "url": "https://example.org/a.png", "w": 1}]
        await raw.execute(
            "UPDATE session_segments SET entries_json = $1 WHERE run_id = 'newer'",
            json.dumps(alien),
        )
        old = json.loads(
            await raw.fetchval("SELECT entries_json FROM session_segments WHERE run_id = 'old'")
        )
        old[1]["timing"] = {"ms": 12}  # a key a newer release added
        await raw.execute(
            "UPDATE session_segments SET entries_json = $1 WHERE run_id = 'old'", json.dumps(old)
        )

        assert await session.trim_tool_results("s", keep_chars=10) == 1

        stored = {
            row["run_id"]: json.loads(row["entries_json"])
            for row in await raw.fetch("SELECT run_id, entries_json FROM session_segments")
        }
        assert stored["newer"] == alien
        assert stored["old"][1]["timing"] == {"ms": 12}
        assert stored["old"][1]["output"] == trim_output("c1", long, 10)
        with pytest.raises(StoredDataError, match="run_id='newer'.*image"):
            await session.load("s")  # reading it is still loud


async def test_trim_beyond_postgresql_integers_trims_nothing(postgres_dsn: str) -> None:
    long = "o" * 2_000
    runs = [[ToolCallEntry(f"c{i}", "f", "{}"), ToolResultEntry(f"c{i}", long)] for i in range(2)]
    async with PostgresSession(postgres_dsn) as session:
        for i, entries in enumerate(runs):
            await session.append("s", entries, run_id=f"r{i}")
        assert await session.trim_tool_results("s", keep_runs=2**70) == 0
        assert await session.trim_tool_results("s", keep_chars=2**70) == 0
        assert await session.load("s") == runs[0] + runs[1]
        assert await session.trim_tool_results("s", keep_chars=10) == 1  # the last run is kept


def test_the_postgresql_stores_load_no_sqlite_module() -> None:
    # Their row encoding is the shared codec's: nothing of the SQLite stores (which
    # another back end may change at will) is theirs to import.
    probe = (
        "import sys\n"
        "import webapp.stores.postgres_checkpoint, webapp.stores.postgres_session\n"
        "print(sorted(m for m in sys.modules if m.startswith('webapp.stores.sqlite')))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"
