"""Crash recovery with real processes: os._exit and SIGKILL mid-run, then re-submit.

Each test runs on SQLite (a file) and on PostgreSQL (a schema of its own).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from webapp import PostgresCheckpointer, PostgresSession, SQLiteCheckpointer, SQLiteSession
from webapp.transcript import ToolCallEntry, ToolResultEntry

pytestmark = pytest.mark.slow  # worker processes killed and run again

WORKER = Path(__file__).with_name("crash_worker.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the worker keeps its stores: a SQLite file or a postgresql:// URL."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_dsn"))
    return str(tmp_path / "jobs.db")


def start(db: str, log: Path, mode: str, turns: list) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(WORKER), db, str(log), mode, json.dumps(turns)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def stored(db: str):
    async def read():
        if db.startswith("postgresql://"):
            session, checkpointer = PostgresSession(db), PostgresCheckpointer(db)
        else:
            session, checkpointer = SQLiteSession(db, wal=True), SQLiteCheckpointer(db, wal=True)
        async with session as s, checkpointer as cp:
            return await s.segments("job-chat"), await cp.load("job-42")

    return asyncio.run(read())


def log_lines(log: Path) -> list[tuple[str, int, int]]:
    if not log.exists():
        return []
    return [
        (n, int(t), int(p)) for n, t, p in (line.split() for line in log.read_text().splitlines())
    ]


def test_os_exit_in_a_tool_then_resubmit_finishes_and_replays(db, tmp_path):
    log = tmp_path / "effects.log"
    script = [[["record", {"tag": "a"}], ["explode", {}]], "all done"]
    code, _, err = finish(start(db, log, "exit", script))
    assert code == 3, err

    segments, snapshot = stored(db)
    assert segments == [] and snapshot.status == "running"
    calls = [e for e in snapshot.entries if isinstance(e, ToolCallEntry)]
    results = [e for e in snapshot.entries if isinstance(e, ToolResultEntry)]
    assert [c.name for c in calls] == ["record", "explode"] and len(results) == 1

    # the re-submission needs exactly one more model call: the final answer
    code, out, err = finish(start(db, log, "plain", ["all done"]))
    assert code == 0, err
    assert json.loads(out) == {"output": "all done", "model_calls": 1}
    first_pid = log_lines(log)[0][2]
    effects = [(name, turn, pid == first_pid) for name, turn, pid in log_lines(log)]
    assert effects == [
        ("record:a", 1, True),
        ("explode", 1, True),
        ("explode", 1, False),  # only the dangling call ran again, with its turn number
    ]
    segments, snapshot = stored(db)
    assert [s.run_id for s in segments] == ["job-42"] and snapshot.status == "completed"
    assert segments[0].entries == snapshot.entries

    # a third submission replays without touching the model (no turns scripted)
    code, out, err = finish(start(db, log, "plain", []))
    assert code == 0, err
    assert json.loads(out) == {"output": "all done", "model_calls": 0}
    assert len(log_lines(log)) == 3
    assert len(stored(db)[0]) == 1


def test_sigkill_during_a_tool_then_resubmit_finishes(db, tmp_path):
    log = tmp_path / "effects.log"
    script = [[["record", {"tag": "first"}]], [["hang", {}]], "finished"]
    proc = start(db, log, "hang", script)
    deadline = time.monotonic() + 30
    while not any(n == "hang" for n, _, _ in log_lines(log)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "worker never reached the hanging tool"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    segments, snapshot = stored(db)
    assert segments == [] and snapshot.status == "running" and snapshot.head.turns == 2

    code, out, err = finish(start(db, log, "plain", ["finished"]))
    assert code == 0, err
    assert json.loads(out)["output"] == "finished"
    names = [(n, t) for n, t, _ in log_lines(log)]
    assert names == [("record:first", 1), ("hang", 2), ("hang", 2)]
    segments, _ = stored(db)
    assert len(segments) == 1
    assert [type(e).__name__ for e in segments[0].entries] == [
        "UserEntry",
        "ToolCallEntry",
        "ToolResultEntry",
        "ToolCallEntry",
        "ToolResultEntry",
        "AssistantEntry",
    ]


def test_sigkill_mid_reply_then_resubmit_continues_the_saved_text(db, tmp_path):
    """SPEC §6: the text streamed before the crash stays; the model is asked to go on."""
    log = tmp_path / "effects.log"
    seen_file = Path(str(log) + ".text")
    words = [f"w{i} " for i in range(1, 401)]
    proc = start(db, log, "stream", ["".join(words)])
    deadline = time.monotonic() + 30
    while len(seen_file.read_text().split() if seen_file.exists() else []) < 60:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the worker did not stream"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    seen = seen_file.read_text()

    saved = asyncio.run(saved_text(db))
    assert seen.startswith(saved)
    # 250 ms of text is 25 words at this pace; the margin is for a loaded machine
    assert len(seen.split()) - len(saved.split()) <= 40, (len(seen.split()), len(saved.split()))

    rest = "".join(words)[len(saved) :]
    code, out, err = finish(start(db, log, "stream", [rest]))
    assert code == 0, err
    result = json.loads(out)
    assert result["output"] == "".join(words)  # the saved words once, then the rest
    (request,) = result["requests"]
    assert request[-1] == {"type": "assistant", "text": saved}
    assert result["continued"] == [True]
    segments, snapshot = stored(db)
    assert snapshot.status == "completed"
    assert [type(e).__name__ for e in segments[0].entries] == ["UserEntry", "AssistantEntry"]
    assert segments[0].entries[1].text == "".join(words)


async def saved_text(db: str) -> str:
    if db.startswith("postgresql://"):
        checkpointer = PostgresCheckpointer(db)
    else:
        checkpointer = SQLiteCheckpointer(db, wal=True)
    async with checkpointer as cp:
        found = await cp.load_streamed("job-42", 0)
    return found.text if found is not None else ""
