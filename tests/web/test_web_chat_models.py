"""A chat's instructions and preset, the picker without JavaScript, the Models page (SPEC §12)."""

from __future__ import annotations

import socket
from pathlib import Path

from test_web_recovery import RUN, leave_behind
from webhelpers import HX, MakeClient, Node, eventually, parse_html, replies

from webapp.chats.store import ChatStore
from webapp.chats.users import EVERY_CHAT
from webapp.config import EndpointConfig, PresetConfig
from webapp.models import ScriptedModel
from webapp.models.endpoints import ModelRegistry
from webapp.transcript import ToolCallEntry, ToolResultEntry, UserEntry
from webapp.web.app import INSTRUCTIONS


def label_of(page: Node, control_id: str) -> str:
    """The text of the label for the control ``control_id``."""
    (label,) = [n for n in page.find_all("label") if n.attrs.get("for") == control_id]
    return label.norm_text()


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_instructions_are_the_system_prompt_from_the_next_run_on(
    web_client_factory: MakeClient,
) -> None:
    model = ScriptedModel(["one", "two", "three"])
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    page = await client.page(chat_id)
    box = page.find("textarea", id="chat-instructions")
    assert label_of(page, "chat-instructions") == "Instructions"
    assert box.attrs["placeholder"] == INSTRUCTIONS and box.text() == ""
    await client.send(chat_id, "first")
    await client.wait_idle(chat_id)
    saved = await client.http.post(
        f"/chats/{chat_id}/instructions", data={"instructions": "  Answer in French.\r\n"}
    )
    assert saved.status_code == 303
    assert (await client.page(chat_id)).find(id="chat-instructions").text() == "Answer in French."
    await client.send(chat_id, "second")
    await client.wait_idle(chat_id)
    await client.http.post(f"/chats/{chat_id}/instructions", data={"instructions": " "})
    await client.send(chat_id, "third")
    await client.wait_idle(chat_id)
    assert model.systems == [INSTRUCTIONS, "Answer in French.", INSTRUCTIONS]
    too_long = {"instructions": "x" * 20_001}
    refused = await client.http.post(f"/chats/{chat_id}/instructions", data=too_long, headers=HX)
    assert refused.status_code == 400 and "20,000" in refused.text
    gone = await client.http.post("/chats/" + "0" * 32 + "/instructions", data={"instructions": ""})
    assert gone.status_code == 404


async def test_a_resume_renders_the_new_instructions_and_keeps_the_runs_model(
    web_client_factory: MakeClient, tmp_path: Path
) -> None:
    """A crash cut a run short after its tool call; meanwhile the chat got new
    instructions and another model. The resume asks the run's own model, with the
    instructions as they are now (the seed's resume renders the system prompt again)."""
    db = tmp_path / "chat.db"
    call = ToolCallEntry("call_1", "calculator", '{"expression": "2+2"}')
    entries = [UserEntry("what is 2+2?"), call, ToolResultEntry("call_1", "4")]
    chat_id = await leave_behind(db, entries, model="a/one")
    async with ChatStore(db) as store:  # what the run's record and the chat hold
        await store.settings.set_instructions(chat_id, "New instructions.")
        await store.settings.set_model(chat_id, "b/two")
    first, second = ScriptedModel(["It is 4."]), ScriptedModel(["not asked"])
    client = await web_client_factory(
        db=db, models=ModelRegistry(fixed={"a/one": first, "b/two": second})
    )
    await client.wait_idle(chat_id)
    assert first.systems == ["New instructions."] and second.systems == []
    reply = replies(await client.page(chat_id))[0]
    assert reply.attrs["data-run-id"] == RUN and reply.attrs["data-model"] == "a/one"


async def test_a_preset_on_the_new_chat_page_sets_model_instructions_and_parameters(
    web_client_factory: MakeClient,
) -> None:
    endpoint = EndpointConfig("local", f"http://127.0.0.1:{closed_port()}/v1", models=("m",))
    preset = PresetConfig("Reviewer", "local/m", "You review code.", 0.2, 256)
    models = ModelRegistry([endpoint], fixed={"offline/x": ScriptedModel([])}, presets=[preset])
    client = await web_client_factory(models=models)
    home = parse_html((await client.http.get("/")).text)
    select = home.find("select", id="preset-select")
    assert label_of(home, "preset-select") == "Preset"
    assert [o.norm_text() for o in select.find_all("option")] == ["None", "Reviewer"]
    sent = await client.http.post("/chats", data={"text": "review this", "preset": "Reviewer"})
    chat_id = sent.headers["location"].rsplit("/", 1)[1]
    await client.wait_idle(chat_id)
    settings = await client.web.store.settings.get(chat_id)
    assert settings is not None
    assert (settings.model, settings.instructions) == ("local/m", "You review code.")
    assert (settings.temperature, settings.max_tokens) == (0.2, 256)
    agent = await client.web.agents.chat_agent(chat_id)
    assert agent.instructions == "You review code."
    # files (§14), cut results, named, built
    built = agent.model.model.model.model  # type: ignore[union-attr]
    assert (built.temperature, built.max_tokens) == (0.2, 256)
    # The endpoint is down: the run failed saying so, and the app goes on.
    reply = replies(await client.page(chat_id))[0]
    assert reply.attrs["data-status"] == "failed" and reply.attrs["data-model"] == "local/m"
    assert "cannot reach the model endpoint" in reply.norm_text()
    unknown = await client.http.post("/chats", data={"text": "x", "preset": "Nobody"})
    assert unknown.status_code == 400 and "no preset" in unknown.text


async def test_use_model_without_javascript_saves_the_choice(
    web_client_factory: MakeClient,
) -> None:
    models = ModelRegistry(fixed={"a/one": ScriptedModel([]), "b/two": ScriptedModel([])})
    client = await web_client_factory(models=models)
    chat_id = await client.new_chat()
    page = await client.page(chat_id)
    assert label_of(page, "model-select") == "Model"
    noscript = page.find("noscript")
    button = noscript.find("button")
    assert button.norm_text() == "Use model"
    assert button.attrs["formaction"] == f"/chats/{chat_id}/model"
    # The button posts the whole composer: the typed text goes along and is not sent.
    posted = await client.http.post(
        f"/chats/{chat_id}/model", data={"text": "draft", "client_id": "c1", "model": "b/two"}
    )
    assert posted.status_code == 303 and posted.headers["location"] == f"/chats/{chat_id}"
    assert (await client.web.session.segments(chat_id)) == []
    page = await client.page(chat_id)
    selected = page.find(id="model-select").find_all("option", selected=True)
    assert [o.attrs["value"] for o in selected] == ["b/two"]


async def test_the_models_section_says_why_an_endpoint_is_missing(
    web_client_factory: MakeClient,
) -> None:
    down = EndpointConfig("down", f"http://127.0.0.1:{closed_port()}/v1")
    up = EndpointConfig("up", "http://127.0.0.1:9/v1", models=("m1",))
    client = await web_client_factory(models=ModelRegistry([up, down]))
    page = parse_html((await client.http.get("/tools")).text)
    section = page.find(id="models-status")
    assert section.find("h2").norm_text() == "Models"
    states = {e.attrs["data-endpoint"]: e for e in section.find_all("li", class_="endpoint")}
    assert states["up"].attrs["data-state"] == "ready" and "up/m1" in states["up"].norm_text()
    assert states["down"].attrs["data-state"] == "failed"
    assert "cannot reach" in states["down"].find(class_="endpoint-error").norm_text()
    # The picker offers what is there; the app works on.
    options = parse_html((await client.http.get("/")).text).find(id="model-select")
    assert [o.attrs["value"] for o in options.find_all("option")] == ["up/m1"]
    refreshed = await client.http.post("/tools/models/refresh", headers=HX)
    assert refreshed.status_code == 200
    assert parse_html(refreshed.text).find(id="models-status")
    plain = await client.http.post("/tools/models/refresh")
    assert plain.status_code == 303 and plain.headers["location"] == "/tools"


async def test_the_chat_total_is_served_for_the_header(web_client_factory: MakeClient) -> None:
    client = await web_client_factory(model=ScriptedModel(["a b c"]))
    chat_id = await client.new_chat()
    sent = await client.send(chat_id, "hi", htmx=True)
    assert sent.status_code == 200
    await client.wait_idle(chat_id)
    state = client.web.runs.latest(chat_id)
    assert state is not None

    async def finished() -> bool:  # its `done` record comes just after the chat's update
        return state.finished

    await eventually(finished, 10, "the run's done record")
    done = client.web.runs.reply_html(state)
    # The finished reply fetches the header's total again, out of band.
    fetch = parse_html(done).find(hx_get=f"/chats/{chat_id}/usage")
    assert fetch.attrs["hx-target"] == "#chat-usage"
    total = parse_html((await client.http.get(f"/chats/{chat_id}/usage")).text)
    node = (await client.web.store.tree(EVERY_CHAT, chat_id)).nodes[state.run_id]
    assert node.usage is not None
    assert total.find(id="chat-usage").attrs["data-tokens-out"] == str(node.usage.output_tokens)
    assert (await client.http.get("/chats/" + "0" * 32 + "/usage")).status_code == 404
