"""What a hostile endpoint sends (SPEC §17): usage figures never lock a chat nor make a
sum overflow, and no page exceeds 1 MB whatever it lists. The endpoint is a real
Chat Completions server on loopback."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from chat_server import API_KEY, ChatServer, text_reply
from people import execute, rows
from webhelpers import MakeClient, WebClient

from webapp.chats.limits import Limits
from webapp.config import EndpointConfig
from webapp.models.chat_stream import usage_from
from webapp.models.endpoints import ModelRegistry
from webapp.usage import Usage

ON_BOTH_DATABASES = True


@pytest.fixture(scope="module")
def endpoint() -> Iterator[ChatServer]:
    server = ChatServer()
    server.start()
    yield server
    server.stop()


async def app_on(make: MakeClient, endpoint: ChatServer, **kwargs: object) -> WebClient:
    endpoint.reset()
    models = ModelRegistry.from_settings(
        base_url=endpoint.base_url, model="test-model", api_key=API_KEY
    )
    return await make(models=models, **kwargs)


async def test_usage_of_ten_to_the_thirty_tokens_does_not_lock_the_chat(
    web_client_factory: MakeClient, endpoint: ChatServer
):
    client = await app_on(web_client_factory, endpoint)
    chat_id = await client.new_chat()
    endpoint.script += [text_reply("Huge", usage=(10**30, 10**30)), text_reply("Next")]
    assert (await client.send(chat_id, "hello")).status_code == 303
    await client.wait_idle(chat_id)  # on main: OverflowError, active_run_id stays set
    found = await rows(client.db, "SELECT tokens_in, tokens_out FROM chat_runs")
    assert found == [(None, None)]  # ignored as none reported, not a made-up count
    assert (await client.send(chat_id, "and again")).status_code == 303
    await client.wait_idle(chat_id)
    page = await client.http.get(f"/chats/{chat_id}")
    assert page.status_code == 200 and "Next" in page.text


async def test_two_replies_that_each_fit_64_bits_do_not_overflow_the_daily_sum(
    web_client_factory: MakeClient, endpoint: ChatServer
):
    client = await app_on(web_client_factory, endpoint, limits=Limits(max_tokens_per_day=1_000_000))
    chat_id = await client.new_chat()
    endpoint.script += [text_reply("One"), text_reply("Two")]
    for text in ("one", "two"):
        await client.send(chat_id, text)
        await client.wait_idle(chat_id)
    await execute(client.db, "UPDATE chat_runs SET tokens_in = ?, tokens_out = ?", 2**62, 2**62 - 1)
    refused = await client.send(chat_id, "three")
    assert refused.status_code == 429  # over the limit, said so: on main a 500 for the day
    usage = await client.http.get(f"/chats/{chat_id}/usage")
    assert usage.status_code == 200


async def test_an_imported_chat_with_huge_usage_opens(
    web_client_factory: MakeClient, endpoint: ChatServer
):
    client = await app_on(web_client_factory, endpoint)
    chat_id = await client.new_chat()
    endpoint.script += [text_reply("One"), text_reply("Two")]
    for text in ("one", "two"):
        await client.send(chat_id, text)
        await client.wait_idle(chat_id)
    exported = json.loads((await client.http.get(f"/chats/{chat_id}/export.json")).content)
    for run in exported["runs"]:
        run["usage"] = {"input_tokens": 2**63 - 1, "output_tokens": 1}
    imported = await client.http.post(
        "/chats/import",
        files={"file": ("chat.json", json.dumps(exported).encode(), "application/json")},
    )
    assert imported.status_code == 303, imported.text
    location = imported.headers["location"]
    assert (await client.http.get(location)).status_code == 200
    # And a database already holding such figures (written before this check) opens too.
    await execute(client.db, "UPDATE chat_runs SET tokens_in = ?", 2**63 - 1)
    assert (await client.http.get(location)).status_code == 200
    usage = await client.http.get(location + "/usage")
    assert usage.status_code == 200


@pytest.mark.parametrize("figure", [True, -1, 2**53, 10**30, 1.5, "12", None], ids=repr)
def test_a_usage_figure_that_is_not_a_sane_count_is_ignored(figure: object):
    usage = usage_from({"prompt_tokens": figure, "completion_tokens": 7})
    assert (usage.input_tokens, usage.output_tokens) == (0, 7)
    assert usage_from({"prompt_tokens": 2**53 - 1}).input_tokens == 2**53 - 1


def test_a_checkpoint_that_holds_a_huge_usage_is_recorded_without_it():
    # Written before this check: a restart replays the run and records its outcome, which
    # reads this. On main it raised OverflowError again, and the chat stayed locked.
    stored = Usage.from_dict({"input_tokens": 10**30, "output_tokens": 12})
    assert (stored.input_tokens, stored.output_tokens) == (0, 12)
    assert (Usage(2**52, 0) + Usage(2**52, 0)).input_tokens == 2**53 - 1  # sums saturate


async def test_no_page_exceeds_a_megabyte_whatever_the_endpoint_lists(
    web_client_factory: MakeClient, endpoint: ChatServer
):
    endpoint.reset()
    # The longest ids that are offered, as many as are offered, then many more.
    endpoint.models = [f"{i:06d}-" + "m" * 193 for i in range(10_000)] + ["x" * 1_000_000]
    models = ModelRegistry.from_settings(
        [EndpointConfig("wide", endpoint.base_url)], base_url=None, model=None, api_key=None
    )
    client = await web_client_factory(models=models)
    assert len(models.names()) == 1000
    chat_id = await client.new_chat()
    for path in ("/", f"/chats/{chat_id}", "/tools", "/search?q=x"):
        page = await client.http.get(path)
        assert page.status_code == 200, path
        assert len(page.content) < 1_000_000, (path, len(page.content))
