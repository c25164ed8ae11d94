"""A turn's streamed text, saved while it streams (webapp.runtime.streaming)."""

from __future__ import annotations

import asyncio

import pytest

from webapp import Agent, CheckpointOptions, InMemoryCheckpointer, Runner
from webapp.models import ScriptedModel
from webapp.runtime import streaming
from webapp.runtime.streaming import TurnSaver, continue_view
from webapp.stores.streamed import StreamedPiece, StreamedTurn
from webapp.transcript import AssistantEntry, ToolCallEntry, ToolResultEntry, UserEntry


class CountingStore(InMemoryCheckpointer):
    """Records every piece; ``fail`` makes the next piece's save raise it."""

    def __init__(self) -> None:
        super().__init__()
        self.pieces: list[StreamedPiece] = []
        self.fail: Exception | None = None

    async def save_streamed(self, run_id, piece):
        await asyncio.sleep(0.001)  # a write takes a moment: text arrives meanwhile
        if self.fail is not None:
            raise self.fail
        self.pieces.append(piece)
        await super().save_streamed(run_id, piece)


async def test_saves_are_batched_and_each_holds_only_the_new_text():
    store = CountingStore()
    saver = TurnSaver(store, "run", 3)
    words = [f" w{i}" for i in range(600)]
    for word in words:  # about 0.6 s of tokens, many per millisecond at times
        saver.add_text(word)
        await asyncio.sleep(0.001)
    await saver.close(flush=True)
    joined = "".join(p.text for p in store.pieces)
    assert joined == "".join(words)  # every word once: nothing rewritten, nothing lost
    assert [p.index for p in store.pieces] == list(range(len(store.pieces)))
    assert {p.turn for p in store.pieces} == {3}
    # one write per interval, not one per token (wide margin: a loaded machine is slower)
    assert 2 <= len(store.pieces) <= 60


async def test_text_is_saved_within_the_interval_and_not_at_once():
    store = CountingStore()
    saver = TurnSaver(store, "run", 0)
    saver.add_text("first")
    await asyncio.sleep(streaming.FIRST_WAIT / 2)
    assert store.pieces == []  # the first token does not wait behind a write
    await asyncio.sleep(streaming.SAVE_INTERVAL + 0.3)
    assert [p.text for p in store.pieces] == ["first"]
    saver.add_text(" second")
    await asyncio.sleep(streaming.SAVE_INTERVAL + 0.3)
    assert [p.text for p in store.pieces] == ["first", " second"]
    await saver.close(flush=False)


class GroupingStore(InMemoryCheckpointer):
    """Groups the saves that reach it in one turn of the event loop, as a store's
    queue would take them into one transaction."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[list[str]] = []
        self._open: list[str] | None = None

    async def save_streamed(self, run_id, piece):
        if self._open is None:
            self._open = []
            self.groups.append(self._open)
            asyncio.get_running_loop().call_soon(self._close)
        self._open.append(run_id)
        await super().save_streamed(run_id, piece)

    def _close(self) -> None:
        self._open = None


async def test_replies_streaming_at_once_save_together_on_the_clocks_ticks():
    store = GroupingStore()
    savers = []
    for i in range(3):  # replies that began apart, as in a busy server
        savers.append(TurnSaver(store, f"run{i}", 0))
        savers[-1].add_text("first ")
        await asyncio.sleep(0.037)
    loop = asyncio.get_running_loop()
    until = loop.time() + 4 * streaming.SAVE_INTERVAL
    while loop.time() < until:  # tokens keep coming for every reply
        for saver in savers:
            saver.add_text("w ")
        await asyncio.sleep(0.01)
    for saver in savers:
        await saver.close(flush=False)
    saves = sum(len(group) for group in store.groups)
    assert saves >= 9  # each reply saved on at least three ticks
    # One write per tick for all three (the first tick may come before the last began),
    # not three writes apart: a store commits each group at once.
    assert all(sorted(g) == ["run0", "run1", "run2"] for g in store.groups[1:])
    assert len(store.groups) <= saves // 3 + 1


async def test_closing_without_flush_drops_what_the_turns_own_save_holds():
    store = CountingStore()
    saver = TurnSaver(store, "run", 0)
    saver.add_text("a")
    await asyncio.sleep(streaming.SAVE_INTERVAL + 0.1)
    saver.add_text("b")
    await saver.close(flush=False)
    await asyncio.sleep(streaming.SAVE_INTERVAL + 0.1)
    assert [p.text for p in store.pieces] == ["a"]


async def test_a_turn_that_starts_tool_calls_is_marked_to_be_redone():
    store = CountingStore()
    saver = TurnSaver(store, "run", 0)
    saver.add_text("Let me check.")
    await asyncio.sleep(streaming.SAVE_INTERVAL + 0.1)
    saver.mark_calls()
    await saver.close(flush=True)
    found = await store.load_streamed("run", 0)
    assert found is not None and found.calls
    assert await streaming.resumable_turn(store, "run", 0) is None


async def test_a_failed_save_fails_the_run_with_its_error():
    store = CountingStore()
    store.fail = OSError("disk full")
    model = ScriptedModel([" ".join(["word"] * 200)], chunk_delay=0.002)
    with pytest.raises(OSError, match="disk full"):
        await Runner.run(Agent("a", model=model), "go", checkpoint=CheckpointOptions(store, "r1"))
    snapshot = await store.load("r1")
    assert snapshot.status == "failed" and "disk full" in (snapshot.head.error or "")


async def test_a_resume_redoes_a_turn_that_had_no_text():
    store = InMemoryCheckpointer()
    await store.save_streamed("r1", StreamedPiece(0, 0, "", "only thinking"))
    opts = CheckpointOptions(store, "r1")
    head = (await _started(store, opts)).head
    assert head.turns == 0
    model = ScriptedModel(["answer"])
    result = await Runner.run(Agent("a", model=model), "q", checkpoint=opts)
    assert result.output == "answer"
    assert model.continued == [False] and model.requests == [[UserEntry("q")]]


async def _started(store, opts):
    """A run interrupted before its first model turn ended."""
    model = ScriptedModel([asyncio.CancelledError()])
    with pytest.raises(asyncio.CancelledError):
        await Runner.run(Agent("a", model=model), "q", checkpoint=opts)
    return await store.load("r1")


def test_the_saved_text_of_a_continuation_joins_the_reply_it_continues():
    view = [UserEntry("count"), AssistantEntry("1 2 3")]
    saved = StreamedTurn(" 4 5", "", False, 1)
    assert continue_view(view, saved) == [UserEntry("count"), AssistantEntry("1 2 3 4 5")]
    after_tool = [UserEntry("q"), ToolCallEntry("c", "t", "{}"), ToolResultEntry("c", "ok")]
    saved = StreamedTurn("It is", "", False, 1)
    assert continue_view(after_tool, saved) == [*after_tool, AssistantEntry("It is")]
    assert continue_view(view, None) == view  # nothing saved: the turn is redone
