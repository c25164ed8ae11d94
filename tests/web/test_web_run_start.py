"""A run's record commits, then the run starts: the model is never asked for a run the
database does not hold, and a record that fails starts nothing."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from webhelpers import MakeClient, messages, parse_html, reply_text

from webapp.chats.store import NewRun
from webapp.models import ScriptedModel
from webapp.runtime.model import ModelPart, ModelRequest
from webapp.stores.sqlite import CommitFailedError
from webapp.transcript import AssistantEntry, UserEntry

ON_BOTH_DATABASES = True  # every test here that builds the app runs on SQLite and PostgreSQL

Committed = tuple[dict[str, str | None], dict[str, str]]  # chat -> active run; run -> input


async def committed(db: Path | str) -> Committed:
    """What the database holds for every reader: read on a connection of its own."""
    chats_sql = "SELECT id, active_run_id FROM chats"
    inputs_sql = "SELECT run_id, input FROM run_inputs"
    if isinstance(db, Path):
        with closing(sqlite3.connect(db)) as conn:
            return dict(conn.execute(chats_sql).fetchall()), dict(
                conn.execute(inputs_sql).fetchall()
            )
    conn = await asyncpg.connect(db)
    try:
        chats = {r[0]: r[1] for r in await conn.fetch(chats_sql)}
        return chats, {r[0]: r[1] for r in await conn.fetch(inputs_sql)}
    finally:
        await conn.close()


class CheckingModel(ScriptedModel):
    """A scripted model that notes, each time it is asked, what the database holds
    and whether the run's record had been returned as committed."""

    def __init__(self, turns: list[str]) -> None:
        super().__init__(turns)
        self.db: Path | str = ""  # the app's database, once it is built
        self.returned = asyncio.Event()  # set by the test once begin_run has returned
        self.seen: list[tuple[bool, Committed]] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        self.seen.append((self.returned.is_set(), await committed(self.db)))
        async for part in super().stream(request):
            yield part


async def test_the_model_is_asked_only_once_the_runs_record_is_committed(
    web_client_factory: MakeClient, monkeypatch: pytest.MonkeyPatch
):
    model = CheckingModel(["first reply", "second reply"])
    client = await web_client_factory(model=model)
    model.db = client.db
    chat_id = await client.new_chat()
    store = client.web.runs.store
    real = store.begin_run
    begun: list[str] = []

    async def slow_to_return(chat_id: str, new: NewRun, **kwargs: Any) -> Any:
        model.returned.clear()
        begun.append(new.run_id)
        recorded = await real(chat_id, new, **kwargs)
        # A commit whose fsync takes long: a run started before it returned would
        # ask the model now, for a record that could still be lost.
        await asyncio.sleep(0.1)
        model.returned.set()
        return recorded

    monkeypatch.setattr(store, "begin_run", slow_to_return)
    for n, text in enumerate(["one", "two"]):
        response = await client.send(chat_id, text, client_id=f"c{n}", htmx=True)
        assert response.status_code == 200
        await client.wait_idle(chat_id)
    assert len(model.seen) == 2
    for (returned, (chats, inputs)), run_id, text in zip(
        model.seen, begun, ["one", "two"], strict=True
    ):
        assert returned  # asked after the record was committed, never during its commit
        assert chats[chat_id] == run_id  # another connection sees the run in flight...
        assert inputs[run_id] == text  # ...with the input a restart would run again
    assert model.requests[-1] == [UserEntry("one"), AssistantEntry("first reply"), UserEntry("two")]


async def test_a_run_whose_record_fails_to_commit_never_asks_the_model(
    web_client_factory: MakeClient, monkeypatch: pytest.MonkeyPatch
):
    model = ScriptedModel(["the reply"])
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    store = client.web.runs.store
    real = store.begin_run

    async def failing_commit(*args: Any, **kwargs: Any) -> Any:
        raise CommitFailedError("could not commit to chat.db: disk I/O error")

    monkeypatch.setattr(store, "begin_run", failing_commit)
    with pytest.raises(CommitFailedError):
        await client.send(chat_id, "lost", client_id="x", htmx=True)
    await asyncio.sleep(0.05)  # a run started anyway would have asked by now
    assert model.requests == []
    assert client.web.runs.latest(chat_id) is None
    assert await client.web.session.segments(chat_id) == []

    monkeypatch.setattr(store, "begin_run", real)
    response = await client.send(chat_id, "again", client_id="y", htmx=True)
    assert response.status_code == 200
    await client.wait_idle(chat_id)
    assert model.requests == [[UserEntry("again")]]
    shown = messages(parse_html((await client.http.get(f"/chats/{chat_id}")).text))
    assert [m.attrs["data-role"] for m in shown] == ["user", "assistant"]
    assert reply_text(shown[1]) == "the reply"
