"""A run starts while its record commits: the model is asked during the commit's
fsync, and nothing of the run is kept or shown until the commit is through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from webhelpers import MakeClient, eventually, messages, parse_html, reply_text

from webapp.models import ScriptedModel
from webapp.runtime.model import ModelPart, ModelRequest
from webapp.stores.sqlite import CommitFailedError
from webapp.transcript import AssistantEntry, UserEntry
from webapp.chats.store import Begun, NewRun

SLOW = 0.05  # seconds per scripted word


class WatchedModel(ScriptedModel):
    """A scripted model that knows how each of its streams ended."""

    def __init__(self, turns: list[str]) -> None:
        super().__init__(turns, chunk_delay=SLOW)
        self.ended: list[str] = []  # "streaming", then "finished" or "closed"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        index = len(self.ended)
        self.ended.append("streaming")
        try:
            async for part in super().stream(request):
                yield part
            self.ended[index] = "finished"
        finally:
            if self.ended[index] == "streaming":
                self.ended[index] = "closed"


async def test_the_model_is_asked_while_the_runs_record_commits(
    web_client_factory: MakeClient, monkeypatch: pytest.MonkeyPatch
):
    model = ScriptedModel(["first reply", "second reply"], chunk_delay=SLOW)
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    await client.send(chat_id, "one", client_id="a")
    await client.wait_idle(chat_id)
    store = client.web.runs.chats
    real = store.begin_run
    release = asyncio.Event()

    async def slow_commit(*args: Any, **kwargs: Any) -> Any:
        recorded = await real(*args, **kwargs)
        await release.wait()  # a commit's fsync, as long as the test likes
        return recorded

    monkeypatch.setattr(store, "begin_run", slow_commit)
    send = asyncio.ensure_future(client.send(chat_id, "two", client_id="b", htmx=True))

    async def asked() -> bool:
        return len(model.requests) == 2

    await eventually(asked, 5, "the model to be asked")
    assert model.requests[-1] == [UserEntry("one"), AssistantEntry("first reply"), UserEntry("two")]
    chat = await client.web.store.get(chat_id)
    assert chat is not None and chat.active_run_id is not None
    await asyncio.sleep(4 * SLOW)  # the reply streams on meanwhile...
    assert not send.done()  # ...but the answer waits for the commit
    # ...and so does everything the run writes: its first checkpoint is not there.
    assert await client.web.checkpointer.load(chat.active_run_id) is None
    release.set()
    response = await send
    assert response.status_code == 200
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    assert [s.entries[-1] for s in segments] == [
        AssistantEntry("first reply"),
        AssistantEntry("second reply"),
    ]


async def test_a_run_whose_record_fails_to_commit_is_stopped_and_leaves_nothing(
    web_client_factory: MakeClient, monkeypatch: pytest.MonkeyPatch
):
    model = WatchedModel(["never shown, it goes on and on and on", "the reply"])
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    store = client.web.runs.chats
    real = store.begin_run
    started: list[str] = []

    async def failing_commit(
        chat_id: str, new: NewRun, *, page: int | None = None, written: Any = None
    ) -> Any:
        started.append(new.run_id)
        # The transaction ran (its page is what the chat shows) and then its commit
        # failed: told, then an error, nothing written.
        assert written is not None and page is not None
        chat = await store.get(chat_id)
        assert chat is not None
        written(Begun(chat, await store.page(chat_id, before=None, limit=page, also=[])))

        async def asked() -> bool:
            return len(model.requests) == 1

        await eventually(asked, 5, "the model to be asked")
        await asyncio.sleep(2 * SLOW)  # the reply has begun to stream
        raise CommitFailedError("could not commit to chat.db: disk I/O error")

    monkeypatch.setattr(store, "begin_run", failing_commit)
    with pytest.raises(CommitFailedError):
        await client.send(chat_id, "lost", client_id="x", htmx=True)

    async def stopped() -> bool:
        return model.ended != ["streaming"]

    await eventually(stopped, 5, "the model stream to end")
    assert model.ended == ["closed"]  # closed at once, not left to run on (and bill)
    assert client.web.runs.latest(chat_id) is None
    assert await client.web.checkpointer.load(started[0]) is None
    assert await client.web.session.segments(chat_id) == []

    monkeypatch.setattr(store, "begin_run", real)
    response = await client.send(chat_id, "again", client_id="y", htmx=True)
    assert response.status_code == 200
    await client.wait_idle(chat_id)
    assert model.requests[-1] == [UserEntry("again")]
    shown = messages(parse_html((await client.http.get(f"/chats/{chat_id}")).text))
    assert [m.attrs["data-role"] for m in shown] == ["user", "assistant"]
    assert reply_text(shown[1]) == "the reply"
