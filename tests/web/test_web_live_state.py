"""A finished run's live state is freed once its last reader has gone (SPEC §17)."""

from __future__ import annotations

from webhelpers import MakeClient, eventually, parse_html, parse_sse

from webapp.models import ScriptedModel


async def test_a_finished_runs_live_state_goes_and_its_stored_reply_answers(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(model=ScriptedModel(["one two three", "four five"]))
    runs = client.web.runs
    runs.readers.linger = 3.0  # kept a while after it finished, with no reader yet
    chat_id = await client.new_chat()
    await client.send(chat_id, "hi")
    await client.wait_idle(chat_id)
    state = runs.latest(chat_id)
    assert state is not None
    runs.readers.linger = 0.05
    url = f"/chats/{chat_id}/runs/{state.run_id}/events"
    streamed = parse_sse((await client.http.get(url)).text)  # read to its end, then gone
    assert "one two three" in parse_html(streamed[-1].data).norm_text()

    async def freed() -> bool:
        return runs.latest(chat_id) is None and runs.get(state.run_id) is None

    await eventually(freed, 5, "the finished run's live state to be freed")  # on main: kept
    # A page, or a stream, that comes later reads the stored reply.
    again = parse_sse((await client.http.get(url)).text)
    assert [e.event for e in again] == ["done"]
    assert "one two three" in parse_html(again[0].data).norm_text()
    page = await client.page(chat_id)
    assert "one two three" in page.norm_text()
    # The chat goes on as before.
    await client.send(chat_id, "more")
    await client.wait_idle(chat_id)
    assert "four five" in (await client.page(chat_id)).norm_text()


async def test_a_run_with_no_reader_is_freed_after_it_finishes(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["alpha beta"]))
    runs = client.web.runs
    runs.readers.linger = 0.05
    chat_id = await client.new_chat()
    await client.send(chat_id, "hi")
    await client.wait_idle(chat_id)

    async def freed() -> bool:
        return runs.latest(chat_id) is None

    await eventually(freed, 5, "the finished run's live state to be freed")
