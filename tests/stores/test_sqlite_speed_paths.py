"""The SQLite stores' fast paths give what the plain paths gave, touch only what they must.

- trim: SQLite finds the outputs to shorten and ``json_set`` rewrites just
  those, so rows with nothing to trim are never written and what a newer
  release stored survives; checked against `InMemorySession`, the reference;
- load: entries are built from the decoded dicts directly, so every odd row
  must still decode (or fail) exactly as `entry_from_dict` would have it, and
  the cyclic collector is paused only while they are built.

(How writes are run -- group commit, locks, failures, cancellation -- is
tests/stores/test_sqlite_machinery.py's.)
"""

from __future__ import annotations

import dataclasses
import gc
import json
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from webapp.stores.session import InMemorySession, longest_untrimmed, trim_output
from webapp.stores.sqlite import StoredDataError
from webapp.stores.sqlite_session import SQLiteSession
from webapp.transcript import (
    AssistantEntry,
    Entry,
    ReasoningEntry,
    ToolCallEntry,
    ToolResultEntry,
    UserEntry,
    entry_from_dict,
    entry_to_dict,
)

WAL = pytest.mark.parametrize("wal", [False, True], ids=["rollback", "wal"])
LONG = "x" * 1000


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def tool_run(n: int, *outputs: str, is_error: bool = False) -> list[Entry]:
    entries: list[Entry] = [UserEntry(f"q{n}")]
    for k, output in enumerate(outputs):
        entries.append(ToolCallEntry(f"call-{n}-{k}", "lookup", "{}"))
        entries.append(ToolResultEntry(f"call-{n}-{k}", output, is_error=is_error))
    entries.append(AssistantEntry(f"a{n}"))
    return entries


async def fill_both(runs: list[list[Entry]], path: Path, wal: bool = False) -> tuple[Any, Any]:
    memory, sqlite = InMemorySession(), SQLiteSession(path, wal=wal)
    for i, entries in enumerate(runs):
        for store in (memory, sqlite):
            await store.append("s", entries, run_id=f"r{i}", meta={"i": i})
    return memory, sqlite


def rewritten_rows(path: Path) -> Callable[[], list[int]]:
    """Log every UPDATE of a session row; returns a reader of the seqs logged so far."""
    with closing(raw(path)) as conn:
        conn.execute("CREATE TABLE rewritten (seq INTEGER)")
        conn.execute(
            "CREATE TRIGGER log_rewrite AFTER UPDATE ON session_segments "
            "BEGIN INSERT INTO rewritten VALUES (new.seq); END"
        )

    def read() -> list[int]:
        with closing(raw(path)) as conn:
            return [r[0] for r in conn.execute("SELECT seq FROM rewritten ORDER BY rowid")]

    return read


def stored_entries(path: Path, run_id: str) -> list[dict[str, Any]]:
    with closing(raw(path)) as conn:
        (text,) = conn.execute(
            "SELECT entries_json FROM session_segments WHERE run_id = ?", (run_id,)
        ).fetchone()
    return list(json.loads(text))


def set_stored_entries(path: Path, run_id: str, value: object) -> None:
    text = value if isinstance(value, str | bytes) else json.dumps(value)
    with closing(raw(path)) as conn:
        conn.execute(
            "UPDATE session_segments SET entries_json = ? WHERE run_id = ?", (text, run_id)
        )


# --- trim: only the rows that change ----------------------------------------------------


@WAL
async def test_trim_rewrites_only_the_rows_whose_outputs_get_shorter(
    tmp_path: Path, wal: bool
) -> None:
    keep = 40
    at_bound = "y" * longest_untrimmed(keep)
    runs: list[list[Entry]] = [
        tool_run(0, LONG),  # shortened
        tool_run(1, "short"),
        [UserEntry("no tools"), AssistantEntry("none")],
        tool_run(3, at_bound),  # as long as an output can be and stay whole
        tool_run(4, "short", LONG),  # one of two shortened
        tool_run(5, trim_output("call-5-0", LONG, keep) or ""),  # trimmed before
        tool_run(6, LONG),  # the last run is kept
    ]
    path = tmp_path / "s.db"
    memory, session = await fill_both(runs, path, wal)
    rewrites = rewritten_rows(path)
    try:
        assert await session.trim_tool_results("s", keep_chars=keep) == 2
        assert await memory.trim_tool_results("s", keep_chars=keep) == 2
        assert rewrites() == [1, 5]
        assert await session.segments("s") == await memory.segments("s")
        assert await session.trim_tool_results("s", keep_chars=keep) == 0
        assert rewrites() == [1, 5]  # idempotent: not even rewritten with the same text
    finally:
        await session.close()


@WAL
async def test_trim_leaves_the_connections_secure_delete_as_it_was(
    tmp_path: Path, wal: bool
) -> None:
    # A trim frees long outputs with secure_delete FAST (no page writes added for
    # zeroing them; bench/stores.py shows what that saves); every other write keeps
    # the connection's own setting, whichever the platform's SQLite chose.
    runs = [tool_run(i, LONG * 20) for i in range(3)] + [tool_run(3, "short")]
    _, session = await fill_both(runs, tmp_path / "s.db", wal)
    store = session._store
    try:
        for setting, trimmed in ((1, 2), (0, 0)):
            await store.execute(f"PRAGMA secure_delete = {setting}")
            assert await session.trim_tool_results("s", keep_chars=40, keep_runs=2) == trimmed
            assert await store.fetchall("PRAGMA secure_delete") == [(setting,)]
        await store.execute("PRAGMA secure_delete = 1")
        await session.append("s", tool_run(4, LONG * 20), run_id="r4")
        assert await session.trim_tool_results("s", keep_chars=40) == 1  # run 2, kept before
        assert await store.fetchall("PRAGMA secure_delete") == [(1,)]
    finally:
        await session.close()


async def test_trim_keeps_keys_a_newer_release_added(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SQLiteSession(path) as session:
        await session.append("s", tool_run(0, LONG), run_id="old")
        await session.append("s", tool_run(1, LONG), run_id="last")
        newer = stored_entries(path, "old")
        newer[0]["lang"] = "fr"
        newer[2]["timing"] = {"ms": 12, "cached": False}
        set_stored_entries(path, "old", newer)

        assert await session.trim_tool_results("s", keep_chars=10) == 1
        after = stored_entries(path, "old")
        assert after[0]["lang"] == "fr"
        assert after[2]["timing"] == {"ms": 12, "cached": False}
        assert after[2]["output"] == trim_output("call-0-0", LONG, 10)
        assert [e for i, e in enumerate(after) if i != 2] == [
            e for i, e in enumerate(newer) if i != 2
        ]


async def test_trim_passes_over_a_run_of_a_kind_it_does_not_know(tmp_path: Path) -> None:
    # A newer release's entry kind is not this code's to judge while trimming:
    # the run has nothing to trim, so it is neither read nor written.
    path = tmp_path / "s.db"
    async with SQLiteSession(path) as session:
        await session.append("s", [UserEntry("later")], run_id="newer")
        await session.append("s", tool_run(1, LONG), run_id="old")
        await session.append("s", tool_run(2, LONG), run_id="last")
        alien = [{"type": "image", "url": "https://example.org/a.png"}]
        set_stored_entries(path, "newer", alien)

        assert await session.trim_tool_results("s", keep_chars=10) == 1
        assert stored_entries(path, "newer") == alien
        with pytest.raises(StoredDataError, match="run_id='newer'.*image"):
            await session.load("s")  # reading it is still loud


AWKWARD = [
    "",
    "short",
    "é" * 700,  # two bytes a character
    "😀" * 300,  # four bytes a character, one character to SQLite and to Python
    "a\x00b" * 300,  # NUL characters: SQLite's length() would stop at the first
    '"quoted" \\back\\slashed\\ \n\t\r\x01' * 40,
    "z" * 500 + "\n[trimmed: many of lots characters removed; nothing]",  # looks, is not
    trim_output("call-elsewhere", "w" * 3000, 100) or "",  # another run's marker
    trim_output("call-elsewhere", "w" * 3000, 3) or "",
]


@WAL
async def test_trim_matches_the_reference_on_awkward_outputs(tmp_path: Path, wal: bool) -> None:
    runs = [tool_run(i, text, is_error=i % 2 == 1) for i, text in enumerate(AWKWARD)]
    runs += [tool_run(100 + k, "v" * (longest_untrimmed(40) + k)) for k in range(-1, 4)]
    runs += [tool_run(200, *AWKWARD)]  # all in one run
    memory, session = await fill_both(runs, tmp_path / "s.db", wal)
    try:
        for keep_chars, keep_runs in [(400, 1), (40, 3), (40, 0), (5, 1), (0, 0), (40, 0), (3, 2)]:
            want = await memory.trim_tool_results("s", keep_chars=keep_chars, keep_runs=keep_runs)
            got = await session.trim_tool_results("s", keep_chars=keep_chars, keep_runs=keep_runs)
            assert got == want, (keep_chars, keep_runs)
            assert await session.segments("s") == await memory.segments("s")
    finally:
        await session.close()


async def test_trim_of_a_run_with_many_outputs_trims_them_all(tmp_path: Path) -> None:
    outputs = [f"{i:04d}" + "o" * 600 for i in range(130)]
    memory, session = await fill_both([tool_run(0, *outputs), tool_run(1, "x")], tmp_path / "s.db")
    try:
        assert await session.trim_tool_results("s", keep_chars=7) == 130
        assert await memory.trim_tool_results("s", keep_chars=7) == 130
        assert await session.load("s") == await memory.load("s")
    finally:
        await session.close()


async def test_trim_beyond_sqlite_integers_trims_nothing(tmp_path: Path) -> None:
    async with SQLiteSession(tmp_path / "s.db") as session:
        await session.append("s", tool_run(0, LONG), run_id="a")
        await session.append("s", tool_run(1, LONG), run_id="b")
        assert await session.trim_tool_results("s", keep_runs=2**70) == 0
        assert await session.trim_tool_results("s", keep_chars=2**70) == 0
        assert await session.load("s") == tool_run(0, LONG) + tool_run(1, LONG)


async def test_trim_of_a_row_sqlite_json_cannot_parse(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SQLiteSession(path) as session:
        for i in range(3):
            await session.append("s", tool_run(i, LONG), run_id=f"r{i}")
        # Python reads NaN, SQLite's JSON (before 3.42) does not.
        nan_row = json.dumps([*stored_entries(path, "r0"), {"type": "user", "text": "n", "w": 1}])
        set_stored_entries(path, "r0", nan_row.replace('"w": 1', '"w": NaN'))
        assert await session.trim_tool_results("s", keep_chars=10) == 2
        assert [e for e in await session.load("s") if isinstance(e, ToolResultEntry)] == [
            ToolResultEntry("call-0-0", trim_output("call-0-0", LONG, 10) or ""),
            ToolResultEntry("call-1-0", trim_output("call-1-0", LONG, 10) or ""),
            ToolResultEntry("call-2-0", LONG),
        ]
        set_stored_entries(path, "r1", '[{"type": "tool_result", "output": "' + LONG)  # cut off
        with pytest.raises(StoredDataError, match="run_id='r1'"):
            await session.trim_tool_results("s", keep_chars=5)


@pytest.mark.parametrize("keep", [0, 1, 40, 400])
def test_no_output_up_to_longest_untrimmed_is_ever_trimmed(keep: int) -> None:
    bound = longest_untrimmed(keep)
    bodies = ["q" * n for n in range(bound - 3, bound + 1)]
    for earlier in (0, 1, keep, 3 * keep):
        marked = trim_output("c", "m" * (bound + 50), earlier)
        bodies.append(marked or "")
    for body in bodies:
        for call_id in ("", "c", "call-" + "9" * 40):
            if len(body) <= bound:
                assert trim_output(call_id, body, keep) is None, (len(body), call_id)
    assert trim_output("", "q" * (bound + 5), keep) is not None


# --- load: entries built straight from the stored dicts -------------------------------------

EVERY_KIND: list[Entry] = [
    UserEntry("u"),
    AssistantEntry("a"),
    ReasoningEntry("r"),
    ToolCallEntry("c1", "lookup", '{"q": 1}'),
    ToolResultEntry("c1", "out"),
    ToolResultEntry("c2", "failed", is_error=True),
]


@pytest.mark.parametrize(
    "stored",
    [
        [{"text": "keys in another order", "type": "user"}],
        [{"type": "assistant", "text": "an unknown key", "model": "m1"}],
        [{"type": "tool_result", "call_id": "c", "output": "is_error left to its default"}],
        [{"output": "o", "is_error": True, "call_id": "c", "type": "tool_result"}],
        [{"type": "user", "text": "twice"}, {"type": "user", "text": "twice"}],
    ],
)
async def test_load_builds_what_entry_from_dict_builds(
    tmp_path: Path, stored: list[dict[str, Any]]
) -> None:
    path = tmp_path / "s.db"
    async with SQLiteSession(path) as session:
        await session.append("s", EVERY_KIND, run_id="warm")  # every kind seen once
        await session.append("s", [UserEntry("soon replaced")], run_id="odd")
        set_stored_entries(path, "odd", stored)
        loaded = (await session.load("s"))[len(EVERY_KIND) :]
        want = [entry_from_dict(dict(item)) for item in stored]
        assert loaded == want
        assert [type(e) for e in loaded] == [type(e) for e in want]
        assert [repr(e) for e in loaded] == [repr(e) for e in want]
        assert [hash(e) for e in loaded] == [hash(e) for e in want]
        assert [entry_to_dict(e) for e in loaded] == [entry_to_dict(e) for e in want]
        # No stray attributes, and in field order: written back, they read as before.
        assert [list(vars(e).items()) for e in loaded] == [list(vars(e).items()) for e in want]
        for entry in loaded:
            assert dataclasses.replace(entry) == entry
            with pytest.raises(dataclasses.FrozenInstanceError):
                entry.text = "changed"  # type: ignore[misc,union-attr]
        assert (await session.segments("s"))[1].entries == want


@pytest.mark.parametrize(
    "stored, message",
    [
        ([{"type": "user"}], "malformed user entry"),
        ([{"type": "user", "text": "x"}, {"type": "alien"}], "alien"),
        ([{"type": ["user"], "text": "x"}], "unknown transcript entry type"),
        (["just a string"], "has no attribute"),
        ([["a", "list"]], "has no attribute"),
        ({"type": "user", "text": "not in a list"}, "JSON list"),
        ('[{"type": "user", "text": "x"}] trailing', "Extra data"),
    ],
)
async def test_load_rejects_what_entry_from_dict_rejects(
    tmp_path: Path, stored: object, message: str
) -> None:
    path = tmp_path / "s.db"
    async with SQLiteSession(path) as session:
        await session.append("s", EVERY_KIND, run_id="warm")
        await session.append("s", [UserEntry("soon bad")], run_id="bad")
        set_stored_entries(path, "bad", stored)
        for read in (session.load, session.segments):
            with pytest.raises(StoredDataError, match=f"run_id='bad'.*{message}"):
                await read("s")


async def test_load_reads_rows_other_programs_wrote(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SQLiteSession(path) as session:
        await session.append("s", EVERY_KIND, run_id="a")
        await session.append("s", EVERY_KIND, run_id="b")
        text = json.dumps([entry_to_dict(e) for e in EVERY_KIND], indent=2)
        set_stored_entries(path, "a", f"\n  {text}\n")  # whitespace around the value
        set_stored_entries(path, "b", text.encode())  # a BLOB
        assert await session.load("s") == EVERY_KIND + EVERY_KIND


async def test_append_writes_what_entry_to_dict_writes(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SQLiteSession(path) as session:
        await session.append("s", EVERY_KIND, run_id="a")
        await session.append("s", EVERY_KIND, run_id="b")  # the second uses the fast path
    for run_id in ("a", "b"):
        with closing(raw(path)) as conn:
            (text,) = conn.execute(
                "SELECT entries_json FROM session_segments WHERE run_id = ?", (run_id,)
            ).fetchone()
        assert text == json.dumps([entry_to_dict(e) for e in EVERY_KIND], ensure_ascii=False)


@pytest.mark.parametrize("collecting", [True, False])
async def test_load_pauses_the_collector_only_while_it_builds(tmp_path: Path, collecting: bool):
    entries = [UserEntry("q"), AssistantEntry("a")]
    async with SQLiteSession(tmp_path / "s.db") as session:
        await session.append("s", entries, run_id="r1")
        await session.append("s", [UserEntry("more")], run_id="r2")
        seen: list[bool] = []
        real = gc.disable
        try:
            gc.disable = lambda: (seen.append(True), real())[1]  # type: ignore[assignment]
            (gc.enable if collecting else gc.disable)()
            assert await session.load("s") == [*entries, UserEntry("more")]
            assert seen and gc.isenabled() == collecting  # as it was before the load
        finally:
            gc.disable = real  # type: ignore[assignment]
            gc.enable()
