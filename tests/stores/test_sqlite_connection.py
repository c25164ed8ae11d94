"""Opening a store's SQLite file: transient failures ridden out, lasting ones reported clearly."""

from __future__ import annotations

import logging
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from webapp.stores.sqlite import SQLiteStore
from webapp.stores.sqlite_connection import StoreOpenError, split_statements
from webapp.stores.sqlite_session import SQLiteSession
from webapp.transcript import UserEntry

LOGGER = "webapp.stores.sqlite_connection"


def retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelname == "WARNING"]


async def test_a_transient_unable_to_open_is_retried_and_the_append_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "s.db"
    real_connect = sqlite3.connect
    failures_left = 2

    def flaky_connect(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        # What aiosqlite calls on its own thread: fail the first opens of our file
        # the way SQLite does when, say, the process is briefly out of descriptors.
        nonlocal failures_left
        if str(database) == str(db) and failures_left:
            failures_left -= 1
            raise sqlite3.OperationalError("unable to open database file")
        return real_connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", flaky_connect)
    session = SQLiteSession(db)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        await session.append("s", [UserEntry("hi")], run_id="r")
    await session.close()

    assert failures_left == 0
    with closing(real_connect(db)) as conn:
        assert conn.execute("SELECT session_id, run_id FROM session_segments").fetchall() == [
            ("s", "r")
        ]
    warnings = retry_warnings(caplog)
    assert len(warnings) == 2
    assert all(str(db) in w for w in warnings)
    assert "attempt 1 of" in warnings[0] and "attempt 2 of" in warnings[1]


async def test_a_lasting_open_failure_says_what_to_check_after_bounded_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert sum(SQLiteStore.OPEN_RETRY_DELAYS) < 1.0  # the default delays an error < 1 s
    monkeypatch.setattr(SQLiteStore, "OPEN_RETRY_DELAYS", (0.01, 0.02, 0.04))
    session = SQLiteSession(tmp_path / "missing-dir" / "s.db")

    started = time.monotonic()
    lasting = r"missing-dir.*does not exist.*tried 4 times"
    with (
        caplog.at_level(logging.WARNING, logger=LOGGER),
        pytest.raises(StoreOpenError, match=lasting),
    ):
        await session.append("s", [UserEntry("hi")], run_id="r")
    elapsed = time.monotonic() - started

    assert 0.07 <= elapsed < 1.0
    assert len(retry_warnings(caplog)) == 3
    with pytest.raises(StoreOpenError, match="exists and is writable"):
        await session.load("s")
    assert isinstance(StoreOpenError("x"), sqlite3.OperationalError)  # old handlers still catch it
    assert not (tmp_path / "missing-dir").exists()
    await session.close()


def test_split_statements_keeps_triggers_and_literals_whole() -> None:
    sql = """
    CREATE TABLE t (a TEXT DEFAULT ';');
    CREATE TRIGGER g AFTER INSERT ON t BEGIN
        UPDATE t SET a = 'x;y'; DELETE FROM t WHERE a = ';';
    END;
    """
    parts = split_statements(sql)
    assert len(parts) == 2 and parts[1].startswith("CREATE TRIGGER") and parts[1].endswith("END;")
    with pytest.raises(ValueError, match="incomplete statement"):
        split_statements("CREATE TABLE t (a TEXT DEFAULT 'open literal;")
