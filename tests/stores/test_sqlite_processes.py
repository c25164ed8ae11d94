"""Several real processes writing one WAL file at once: no lock error, nothing lost or doubled."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPENDS = 120

CHILD = """
import asyncio, pathlib, sys, time
from webapp.stores.checkpoint import RunHead
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.stores.sqlite_session import SQLiteSession
from webapp.transcript import AssistantEntry, UserEntry

db, me, n, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), pathlib.Path(sys.argv[4])

async def main():
    session, cp = SQLiteSession(db, wal=True), SQLiteCheckpointer(db, wal=True)
    await session.load("shared")  # open and create the schema before the start signal
    (folder / f"ready-{me}").touch()
    deadline = time.monotonic() + 20
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("no start signal within 20 s")
        await asyncio.sleep(0.005)
    for i in range(n):
        entries = [UserEntry(f"{me}:{i}")] + [AssistantEntry("a")] * (i % 3)
        await session.append("shared", entries, run_id=f"{me}-{i}")
        await cp.append(f"run-{me}", [AssistantEntry(str(i))], RunHead("main", turns=i))
        if i % 20 == 0:
            await session.load("shared")
    await session.close()
    await cp.close()

asyncio.run(main())
"""


def test_three_processes_append_to_one_wal_file_at_once(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    names = ["p0", "p1", "p2"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(db), name, str(APPENDS), str(tmp_path)],
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
        outcomes = [p.communicate(timeout=30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    for proc, (_, err) in zip(procs, outcomes, strict=True):
        assert proc.returncode == 0, err
        assert "locked" not in err, err

    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT run_id, first_entry, entry_count FROM session_segments "
            "WHERE session_id = 'shared' ORDER BY seq"
        ).fetchall()
        # Every segment exactly once ...
        assert sorted(r[0] for r in rows) == sorted(
            f"{n}-{i}" for n in names for i in range(APPENDS)
        )
        # ... at the position the others left for it: the flat view has no gaps.
        position = 0
        for run_id, first, count in rows:
            assert first == position, run_id
            position += count
        for name in names:
            ids = [r[0] for r in rows if r[0].startswith(f"{name}-")]
            assert ids == [f"{name}-{i}" for i in range(APPENDS)]  # each process in its order
            idx = conn.execute(
                "SELECT idx FROM checkpoint_entries WHERE run_id = ? ORDER BY idx", (f"run-{name}",)
            ).fetchall()
            assert [i[0] for i in idx] == list(range(APPENDS))


KILLED = """
import asyncio, os, signal, sys
from webapp.stores.sqlite_session import SQLiteSession
from webapp.transcript import UserEntry

async def main():
    session = SQLiteSession(sys.argv[1], wal=sys.argv[2] == "wal")
    await session.append("s", [UserEntry("kept")], run_id="before-kill")
    if sys.argv[3] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # no close, no cleanup of any kind

asyncio.run(main())
print("exited without close")
"""


def run_child(db: Path, wal: str, how: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", KILLED, str(db), wal, how],
        check=False,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=20,
    )


@pytest.mark.slow
def test_an_append_that_returned_survives_sigkill(tmp_path: Path) -> None:
    for wal in ("wal", "rollback"):
        db = tmp_path / f"{wal}.db"
        proc = run_child(db, wal, "kill")
        assert proc.returncode == -9, proc.stderr
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT run_id, entries_json FROM session_segments").fetchall()
        assert rows == [("before-kill", '[{"type": "user", "text": "kept"}]')]


def test_a_store_nobody_closed_does_not_hang_interpreter_exit(tmp_path: Path) -> None:
    # aiosqlite's thread is not a daemon; the store must not keep the process alive.
    proc = run_child(tmp_path / "s.db", "wal", "leave-open")
    assert proc.returncode == 0, proc.stderr
    assert "exited without close" in proc.stdout


KEPT_OPEN = """
import asyncio, sys
from webapp.stores.sqlite_session import SQLiteSession
from webapp.transcript import UserEntry

KEPT = SQLiteSession(sys.argv[1], wal=True)  # referenced to the end, never closed

asyncio.run(KEPT.append("s", [UserEntry("kept")], run_id="r"))
print("appended")
"""


def test_a_store_still_referenced_at_exit_does_not_hang_it(tmp_path: Path) -> None:
    # Garbage collection cannot stop this store's thread before exit, as it may for
    # one nobody refers to any more: only a daemon thread lets the interpreter go.
    proc = subprocess.run(
        [sys.executable, "-c", KEPT_OPEN, str(tmp_path / "s.db")],
        check=False,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, "appended"), proc.stderr
    with sqlite3.connect(tmp_path / "s.db") as conn:
        assert conn.execute("SELECT run_id FROM session_segments").fetchall() == [("r",)]
