"""The chat tree (SPEC §7): the shown path, version numbering, continuation, and a
switch that a kill -9 interrupts at any moment."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from webhelpers import MakeClient

from webapp.chats.tree import Node, Tree, Versions, continued
from webapp.models import ScriptedModel
from webapp.transcript import AssistantEntry, ToolCallEntry, UserEntry

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("switch_worker.py")


def node(run_id: str, parent: str | None, message: str, seq: int, selected: int) -> Node:
    return Node(run_id, parent, message, seq, selected)


def test_the_path_follows_the_newest_selection_at_every_level():
    a1, b1, b2 = (
        node("a1", None, "A", 1, 1),
        node("b1", "a1", "B", 2, 2),
        node("b2", "a1", "B", 3, 4),
    )
    c1 = node("c1", "b2", "C", 4, 5)
    edited = Tree([a1, b1, b2, c1, node("a2", None, "A2", 5, 6)])  # A edited last
    assert [n.run_id for n in edited.path()] == ["a2"]
    # A's first version chosen again: below it b2 (chosen over b1) and c1 come back.
    back = Tree([a1, b1, b2, c1, node("a2", None, "A2", 5, 6), node("a1", None, "A", 1, 7)])
    assert [n.run_id for n in back.path()] == ["a1", "b2", "c1"]
    versions = back.versions(back.path())
    assert versions.of_message("a1") == Versions(1, 2, None, "a2")
    assert versions.of_reply("b2") == Versions(2, 2, "b1", None)
    assert versions.of_message("b2") is None and versions.of_reply("a1") is None


def test_a_message_version_switcher_shows_each_messages_own_choice():
    tree = Tree(
        [
            node("a1", None, "A", 1, 1),
            node("a1r", None, "A", 2, 4),  # A regenerated: chosen within A
            node("a2", None, "A2", 3, 5),
        ]
    )
    versions = tree.versions(tree.path())
    # Going back to message A shows the run last chosen there, not its first.
    assert versions.of_message("a2") == Versions(2, 2, "a1r", None)
    assert versions.of_reply("a2") is None


def test_a_continuation_joins_the_replys_last_text():
    entries = [UserEntry("count to 5"), AssistantEntry("1 2 ")]
    assert continued(entries, [AssistantEntry("3 4 5")]) == [
        UserEntry("count to 5"),
        AssistantEntry("1 2 3 4 5"),
    ]
    call = ToolCallEntry("c1", "calculator", "{}")
    assert continued(entries, [call]) == [*entries, call]
    assert continued(entries, []) == entries


def _state(db: Path, chat_id: str) -> tuple[list[str], list[str], list[str], Tree]:
    """(session run ids in order, archived run ids, all node ids, the tree)."""
    with sqlite3.connect(db) as conn:
        session = [
            r[0]
            for r in conn.execute(
                "SELECT run_id FROM session_segments WHERE session_id = ? ORDER BY seq",
                (chat_id,),
            )
        ]
        rows = conn.execute(
            "SELECT run_id, parent_run_id, message_id, seq, selected, entries_json "
            "FROM chat_runs WHERE chat_id = ?",
            (chat_id,),
        ).fetchall()
    archived = [r[0] for r in rows if r[5] is not None]
    tree = Tree(Node(r[0], r[1], r[2], r[3], r[4]) for r in rows)
    return session, archived, [r[0] for r in rows], tree


@pytest.mark.slow
async def test_kill_9_during_switches_loses_no_version_and_duplicates_none(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    client = await web_client_factory(
        db=db, model=ScriptedModel(["r1", "r2", "r3", "r2 again", "r1 again"])
    )
    chat_id = await client.new_chat()
    for text in ("one", "two", "three"):
        await client.send(chat_id, text)
        await client.wait_idle(chat_id)
    two = (await client.web.session.segments(chat_id))[1].run_id
    await client.http.post(f"/chats/{chat_id}/regenerate", data={"run_id": two})
    await client.wait_idle(chat_id)
    one = (await client.web.session.segments(chat_id))[0].run_id
    await client.http.post(f"/chats/{chat_id}/regenerate", data={"run_id": one})
    await client.wait_idle(chat_id)
    newest = (await client.web.session.segments(chat_id))[0].run_id
    # The app stays open beside the worker (WAL: both may use the file).
    contents: dict[str, str] = {}
    with sqlite3.connect(db) as conn:
        for run_id, data in conn.execute(
            "SELECT run_id, entries_json FROM session_segments WHERE session_id = ?", (chat_id,)
        ):
            contents[run_id] = data
        for run_id, data in conn.execute(
            "SELECT run_id, entries_json FROM chat_runs WHERE chat_id = ? AND entries_json "
            "IS NOT NULL",
            (chat_id,),
        ):
            contents[run_id] = data
    assert len(contents) == 5
    await asyncio.to_thread(_kill_switches, db, chat_id, (one, newest), contents)


def _kill_switches(db: Path, chat_id: str, runs: tuple[str, str], contents: dict[str, str]) -> None:
    """Kill a worker that switches between two versions at random moments; after each
    kill, every version is in one place, unchanged, and the session is the shown path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rng = random.Random(7)
    for _ in range(6):
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(db), chat_id, *runs],
            stdout=subprocess.PIPE,
            env=env,
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        session, archived, nodes, tree = _state(db, chat_id)
        # Every version is in exactly one place: the session or the archive.
        assert sorted(session + archived) == sorted(nodes)
        # The session is exactly the path the tree selects.
        assert session == [n.run_id for n in tree.path()]
        with sqlite3.connect(db) as conn:
            now = dict(
                conn.execute(
                    "SELECT run_id, entries_json FROM session_segments WHERE session_id = ?",
                    (chat_id,),
                ).fetchall()
                + conn.execute(
                    "SELECT run_id, entries_json FROM chat_runs WHERE chat_id = ? "
                    "AND entries_json IS NOT NULL",
                    (chat_id,),
                ).fetchall()
            )
        assert now == contents  # nothing changed in any version
