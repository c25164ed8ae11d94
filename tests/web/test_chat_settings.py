"""Each run's record of its model and usage, and a chat's own model (SPEC §12).

What the database holds is read on a connection of its own, as another engineer's
per-day sum would read it: ``chat_runs.model``, ``tokens_in``, ``tokens_out`` and
``finished_at``, filled when the run's outcome is recorded.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import asyncpg
from webhelpers import HX, MakeClient, parse_html, replies

from webapp.models import ScriptedModel
from webapp.models.endpoints import ModelRegistry
from webapp.models.scripted import CutOff
from webapp.runtime.model import Model, ModelPart, ModelRequest, UsagePart
from webapp.usage import Usage

ON_BOTH_DATABASES = True  # every test here that builds the app runs on SQLite and PostgreSQL

RunRow = tuple[str | None, int | None, int | None, float | None]


async def run_rows(db: Path | str) -> dict[str, RunRow]:
    """run_id -> (model, tokens_in, tokens_out, finished_at), as committed."""
    sql = "SELECT run_id, model, tokens_in, tokens_out, finished_at FROM chat_runs"
    if isinstance(db, Path):
        with closing(sqlite3.connect(db)) as conn:
            return {r[0]: tuple(r[1:]) for r in conn.execute(sql).fetchall()}  # type: ignore[misc]
    conn = await asyncpg.connect(db)
    try:
        return {r[0]: (r[1], r[2], r[3], r[4]) for r in await conn.fetch(sql)}
    finally:
        await conn.close()


class Reporting:
    """A model that notes the usage it reports: what a run's record must add up to.
    ``report=False``: it reports none, as some endpoints do."""

    def __init__(self, model: Model, *, report: bool = True) -> None:
        self.model, self.report = model, report
        self.usage: list[Usage] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        async for part in self.model.stream(request):
            if isinstance(part, UsagePart):
                if not self.report:
                    continue
                self.usage.append(part.usage)
            yield part


def total(usage: list[Usage]) -> Usage:
    return sum(usage, Usage())


async def test_a_run_records_its_model_and_the_usage_of_all_its_turns(
    web_client_factory: MakeClient,
) -> None:
    model = Reporting(ScriptedModel([[("calculator", {"expression": "2+2"})], "It is 4."]))
    client = await web_client_factory(models=ModelRegistry(fixed={"local/calc": model}))
    chat_id = await client.new_chat()
    before = time.time()
    await client.send(chat_id, "what is 2+2?")
    await client.wait_idle(chat_id)
    assert len(model.usage) == 2  # two model turns: the tool call, then the answer
    expected = total(model.usage)
    run_id = (await client.web.session.segments(chat_id))[0].run_id
    name, tokens_in, tokens_out, finished_at = (await run_rows(client.db))[run_id]
    assert (name, tokens_in, tokens_out) == ("local/calc", *expected.to_dict().values())
    assert finished_at is not None and before <= finished_at <= time.time()
    page = await client.page(chat_id)
    reply = replies(page)[0]
    assert reply.attrs["data-model"] == "local/calc"
    assert reply.attrs["data-tokens-in"] == str(expected.input_tokens)
    assert reply.attrs["data-tokens-out"] == str(expected.output_tokens)
    assert "local/calc" in reply.find(class_="reply-meta").norm_text()
    header = page.find(id="chat-usage")
    assert header.attrs["data-tokens-in"] == str(expected.input_tokens)
    assert f"{expected.input_tokens:,} tokens in" in header.norm_text()


async def test_an_endpoint_that_reports_no_usage_shows_none(web_client_factory: MakeClient):
    model = Reporting(ScriptedModel(["Fine."]), report=False)
    client = await web_client_factory(models=ModelRegistry(fixed={"quiet/m": model}))
    chat_id = await client.new_chat()
    await client.send(chat_id, "hello")
    await client.wait_idle(chat_id)
    ((name, tokens_in, tokens_out, finished_at),) = (await run_rows(client.db)).values()
    assert (name, tokens_in, tokens_out) == ("quiet/m", None, None) and finished_at is not None
    page = await client.page(chat_id)
    reply = replies(page)[0]
    assert "data-tokens-in" not in reply.attrs and "data-tokens-out" not in reply.attrs
    assert reply.find_all(class_="reply-usage") == []
    assert page.find(id="chat-usage").norm_text() == "No token counts yet"


async def test_a_continuation_adds_its_usage_to_the_reply_it_continues(
    web_client_factory: MakeClient,
) -> None:
    model = Reporting(ScriptedModel([CutOff("one two"), "three four"]))
    client = await web_client_factory(models=ModelRegistry(fixed={"local/m": model}))
    chat_id = await client.new_chat()
    await client.send(chat_id, "count")
    await client.wait_idle(chat_id)
    run_id = (await client.web.session.segments(chat_id))[0].run_id
    response = await client.http.post(f"/chats/{chat_id}/runs/{run_id}/continue")
    assert response.status_code == 303
    await client.wait_idle(chat_id)
    rows = await run_rows(client.db)
    assert list(rows) == [run_id]  # a continuation has no node of its own
    expected = total(model.usage)
    assert rows[run_id][1:3] == (expected.input_tokens, expected.output_tokens)
    reply = replies(await client.page(chat_id))[0]
    assert reply.attrs["data-tokens-out"] == str(expected.output_tokens)


async def test_regenerate_with_another_model_makes_that_models_version(
    web_client_factory: MakeClient,
) -> None:
    first, second = ScriptedModel(["From one."]), ScriptedModel(["From two.", "Again two."])
    models = ModelRegistry(fixed={"a/one": first, "b/two": second})
    client = await web_client_factory(models=models)
    chat_id = await client.new_chat()
    page = await client.page(chat_id)
    options = [o.attrs["value"] for o in page.find(id="model-select").find_all("option")]
    assert options == ["a/one", "b/two"]
    await client.send(chat_id, "hi")
    await client.wait_idle(chat_id)
    old = (await client.web.session.segments(chat_id))[0].run_id
    # The picker's change, as htmx posts it: saved at once, nothing to swap.
    chosen = await client.http.post(f"/chats/{chat_id}/model", data={"model": "b/two"}, headers=HX)
    assert chosen.status_code == 204
    picked = parse_html((await client.http.get(f"/chats/{chat_id}")).text).find(id="model-select")
    assert [o.attrs["value"] for o in picked.find_all("option", selected=True)] == ["b/two"]
    await client.http.post(f"/chats/{chat_id}/regenerate", data={"run_id": old})
    await client.wait_idle(chat_id)
    reply = replies(await client.page(chat_id))[0]
    assert reply.attrs["data-model"] == "b/two" and "From two." in reply.norm_text()
    assert "other versions by a/one" in reply.find(class_="reply-meta").norm_text()
    assert len(first.requests) == 1 and len(second.requests) == 1
    await client.http.post(f"/chats/{chat_id}/switch", data={"run_id": old})
    reply = replies(await client.page(chat_id))[0]
    assert reply.attrs["data-model"] == "a/one" and "From one." in reply.norm_text()
    rows = await run_rows(client.db)
    assert sorted(r[0] or "" for r in rows.values()) == ["a/one", "b/two"]
    # A model that is not on offer is refused, and the chat's choice stays.
    refused = await client.http.post(f"/chats/{chat_id}/model", data={"model": "c/none"})
    assert refused.status_code == 400 and "not on offer" in refused.text
    assert (await client.web.store.settings.get(chat_id)).model == "b/two"  # type: ignore[union-attr]


async def test_a_branch_keeps_model_and_usage_but_counts_nothing_twice(
    web_client_factory: MakeClient,
) -> None:
    client = await web_client_factory(
        models=ModelRegistry(fixed={"a/one": ScriptedModel(["Answer."])})
    )
    chat_id = await client.new_chat()
    await client.send(chat_id, "hi")
    await client.wait_idle(chat_id)
    await client.web.store.settings.set_instructions(chat_id, "Talk like a pirate.")
    run_id = (await client.web.session.segments(chat_id))[0].run_id
    branched = await client.http.post(f"/chats/{chat_id}/runs/{run_id}/branch")
    branch_id = branched.headers["location"].rsplit("/", 1)[1]
    rows = await run_rows(client.db)
    copy = next(r for r in rows if r != run_id)
    assert rows[copy][:3] == rows[run_id][:3] and rows[run_id][1] is not None
    assert rows[copy][3] is None  # a per-day sum over finished_at counts the run once
    settings = await client.web.store.settings.get(branch_id)
    assert settings is not None and settings.instructions == "Talk like a pirate."


async def test_export_and_import_keep_each_runs_model_and_usage(
    web_client_factory: MakeClient,
) -> None:
    model = Reporting(ScriptedModel(["Answer.", "Answer again."]))
    client = await web_client_factory(models=ModelRegistry(fixed={"a/one": model}))
    chat_id = await client.new_chat()
    await client.send(chat_id, "hi")
    await client.wait_idle(chat_id)
    exported = (await client.http.get(f"/chats/{chat_id}/export.json")).json()
    (run,) = exported["runs"]
    assert run["model"] == "a/one" and run["usage"] == model.usage[0].to_dict()
    older: dict[str, Any] = json.loads(json.dumps(exported))
    for old_run in older["runs"]:
        del old_run["model"], old_run["usage"]  # a file from before models per chat
    for document, model_name, usage in ((exported, "a/one", model.usage[0]), (older, "", None)):
        files = {"file": ("chat.json", json.dumps(document).encode(), "application/json")}
        imported = await client.http.post("/chats/import", files=files)
        assert imported.status_code == 303, imported.text
        new_id = imported.headers["location"].rsplit("/", 1)[1]
        reply = replies(await client.page(new_id))[0]
        assert reply.attrs["data-model"] == model_name
        assert reply.attrs.get("data-tokens-in") == (str(usage.input_tokens) if usage else None)
        again = (await client.http.get(f"/chats/{new_id}/export.json")).json()["runs"][0]
        assert again["model"] == (model_name or None)
        assert again["usage"] == (usage.to_dict() if usage else None)
    imported_rows = [
        r for run_id, r in (await run_rows(client.db)).items() if run_id != run["run_id"]
    ]
    assert [r[3] for r in imported_rows] == [None, None]  # an import cost nothing here
    bad = dict(exported, runs=[dict(run, usage={"input_tokens": -1, "output_tokens": 2})])
    files = {"file": ("chat.json", json.dumps(bad).encode(), "application/json")}
    refused = await client.http.post("/chats/import", files=files)
    assert refused.status_code == 400 and "runs[0].usage" in refused.text
