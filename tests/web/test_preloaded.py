"""A new run's first reads answered from its record's page, and only its first; all
it asks of the stores waits for its record's commit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from webapp.runtime.options import CheckpointOptions
from webapp.stores import RunHead, Segment, SQLiteCheckpointer, SQLiteSession
from webapp.stores.sqlite import CommitFailedError
from webapp.transcript import AssistantEntry, UserEntry
from webapp.chats.store import Page
from webapp.chats.tree import Tree
from webapp.web.live.preloaded import NewRunCheckpointer, PreloadedSession, preloaded

STORED = [UserEntry("stored"), AssistantEntry("in the file")]
PAGE = [Segment("r1", [UserEntry("on the page")]), Segment("r2", [AssistantEntry("too")])]


async def test_the_first_load_of_the_chat_is_the_pages_then_the_files(tmp_path: Path):
    async with SQLiteSession(tmp_path / "s.db") as real:
        await real.append("chat", STORED, run_id="r0")
        await real.append("other", [UserEntry("elsewhere")], run_id="r9")
        session, _ = preloaded(
            Page(PAGE, False, Tree([])), "chat", real, CheckpointOptions(real_cp(tmp_path), "new")
        )
        assert await session.load("other") == [UserEntry("elsewhere")]
        assert await session.load("chat") == STORED  # once only: it was spent above
        fresh = PreloadedSession(real, "chat", [UserEntry("preloaded")])
        assert await fresh.load("chat") == [UserEntry("preloaded")]
        assert await fresh.load("chat") == STORED
        written = PreloadedSession(real, "chat", [UserEntry("preloaded")])
        await written.append("chat", [UserEntry("more")], run_id="r3")
        assert await written.load("chat") == [*STORED, UserEntry("more")]
        assert [s.run_id for s in await written.segments("chat")] == ["r0", "r3"]
        await written.clear("chat")
        assert await real.load("chat") == []


async def test_the_new_runs_first_checkpoint_read_asks_nobody(tmp_path: Path):
    async with real_cp(tmp_path) as real:
        await real.append("new", [UserEntry("left over")], RunHead("assistant"))
        await real.append("old", [UserEntry("kept")], RunHead("assistant"))
        checkpointer = NewRunCheckpointer(real, "new")
        assert await checkpointer.load("old") is not None  # another run's: asked
        assert await checkpointer.load("new") is not None  # spent by the first load
        checkpointer = NewRunCheckpointer(real, "new")
        assert await checkpointer.load("new") is None
        snapshot = await checkpointer.load("new")
        assert snapshot is not None and snapshot.entries == [UserEntry("left over")]
        checkpointer = NewRunCheckpointer(real, "new")
        await checkpointer.append("new", [UserEntry("its own")], RunHead("assistant"))
        snapshot = await checkpointer.load("new")  # what the run wrote itself
        assert snapshot is not None and snapshot.entries[-1] == UserEntry("its own")
        await checkpointer.delete("new")
        assert await real.load("new") is None


async def test_a_page_that_is_not_the_whole_path_answers_nothing(tmp_path: Path):
    async with SQLiteSession(tmp_path / "s.db") as real:
        options = CheckpointOptions(real_cp(tmp_path), "new")
        for page in (None, Page(PAGE, True, Tree([]))):  # none, or older runs before it
            assert preloaded(page, "chat", real, options) == (real, options)
        session, kept = preloaded(Page(PAGE, False, Tree([])), "chat", real, options)
        assert isinstance(session, PreloadedSession)
        assert isinstance(kept.checkpointer, NewRunCheckpointer)
        assert (kept.run_id, kept.if_run_exists) == (options.run_id, options.if_run_exists)
        assert await session.load("chat") == [UserEntry("on the page"), AssistantEntry("too")]


async def test_what_the_run_asks_of_the_stores_waits_for_its_record_to_commit(tmp_path: Path):
    async with SQLiteSession(tmp_path / "s.db") as real, real_cp(tmp_path) as cp:
        await real.append("chat", STORED, run_id="r0")
        commit: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        older = Page(PAGE, True, Tree([]))  # not the whole path: nothing is preloaded
        session, options = preloaded(older, "chat", real, CheckpointOptions(cp, "new"), commit)
        load = asyncio.ensure_future(session.load("chat"))
        checkpoint = options.checkpointer
        save = asyncio.ensure_future(checkpoint.append("new", [UserEntry("x")], RunHead("a")))
        await asyncio.sleep(0.05)
        assert not load.done() and not save.done()
        assert await cp.load("new") is None
        commit.set_result(None)
        assert await load == STORED  # what another connection sees once it is committed
        await save
        snapshot = await cp.load("new")
        assert snapshot is not None and snapshot.entries == [UserEntry("x")]


async def test_after_a_failed_commit_nothing_the_run_writes_is_kept(tmp_path: Path):
    async with SQLiteSession(tmp_path / "s.db") as real, real_cp(tmp_path) as cp:
        commit: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        whole = Page(PAGE, False, Tree([]))
        session, options = preloaded(whole, "chat", real, CheckpointOptions(cp, "new"), commit)
        assert await session.load("chat") == [UserEntry("on the page"), AssistantEntry("too")]
        assert await options.checkpointer.load("new") is None  # answered: no waiting
        save = asyncio.ensure_future(
            options.checkpointer.append("new", [UserEntry("x")], RunHead("a"))
        )
        append = asyncio.ensure_future(session.append("chat", [UserEntry("y")], run_id="new"))
        commit.set_exception(CommitFailedError("could not commit: disk I/O error"))
        for write in (save, append):
            with pytest.raises(CommitFailedError):
                await write
        assert await cp.load("new") is None
        assert await real.load("chat") == []


def real_cp(tmp_path: Path) -> SQLiteCheckpointer:
    return SQLiteCheckpointer(tmp_path / "c.db")
