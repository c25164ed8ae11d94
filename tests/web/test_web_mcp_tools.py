"""MCP servers in the web app: their tools in a chat's agent, their results on the cards, and
the Tools page -- against the real test server over real stdio."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from webhelpers import MakeClient, eventually, parse_html, replies

from webapp.chats.store import EVERY_CHAT, ChatStore, NewRun
from webapp.config import AppConfig, McpServerConfig, load_config
from webapp.models import ScriptedModel
from webapp.runtime.agent import Agent
from webapp.stores.checkpoint import RunHead
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.tools import calculator, current_time
from webapp.transcript import ToolCallEntry, ToolResultEntry, UserEntry
from webapp.web.view_models import shown_images

SERVER = Path(__file__).resolve().parents[1] / "mcp_server.py"
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


def stdio_server(tmp_path: Path, **kwargs: object) -> McpServerConfig:
    args = (str(SERVER), str(tmp_path))
    return McpServerConfig(name="test", command=sys.executable, args=args, **kwargs)  # type: ignore[arg-type]


async def test_results_show_text_errors_images_and_formatted_json_safely(
    web_client_factory: MakeClient, tmp_path: Path
):
    calls = [
        ("test__picture", {}),
        ("test__weather", {"city": "<Oslo>"}),
        ("test__fail", {"reason": "<script>alert(1)</script>"}),
        ("test__echo", {"text": "<img src=x onerror=alert(1)>"}),
    ]
    model = ScriptedModel([calls, "All four."])
    config = AppConfig(mcp_servers=(stdio_server(tmp_path),))
    client = await web_client_factory(model=model, config=config)
    chat_id = await client.new_chat()
    await client.send(chat_id, "try them all")
    await client.wait_idle(chat_id)
    [reply] = replies(await client.page(chat_id))
    picture, weather, failed, echo = reply.find_all(data_role="tool")
    [image] = picture.find_all("img")
    assert image.attrs["src"] == PNG
    shown = weather.find(class_="tool-result").text()
    assert json.loads(shown) == {"city": "<Oslo>", "celsius": 21, "sky": "<b>clear</b>"}
    assert '\n  "celsius": 21' in shown  # formatted
    assert weather.find_all("b") == []  # markup in a result is text
    assert failed.attrs["data-error"] == "true"
    assert "failed on purpose" in failed.find(class_="tool-result").text()
    assert reply.find_all("script") == []
    assert echo.find(class_="tool-result").text() == "<img src=x onerror=alert(1)>"
    assert [i.attrs["src"] for i in reply.find_all("img")] == [PNG]


def test_only_plain_data_images_are_shown():
    bad = [
        "javascript:alert(1)",
        "data:text/html;base64,PHNjcmlwdD4=",
        "data:image/svg+xml;base64,PHN2Zz4=",
        'data:image/png;base64,AAAA" onerror="x',
        "https://example.com/a.png",
    ]
    assert shown_images([*bad, PNG]) == (PNG,)


async def test_the_chat_agent_has_the_connected_servers_tools(
    web_client_factory: MakeClient, tmp_path: Path
):
    config = AppConfig(mcp_servers=(stdio_server(tmp_path, tools={"fail": "deny"}),))
    agent = Agent("assistant", model=ScriptedModel([]), tools=[calculator, current_time])
    client = await web_client_factory(agent=agent, config=config)
    chat_id = await client.new_chat()
    tools = {t.name: t for t in (await client.web.agents.chat_agent(chat_id)).tools}
    assert {"calculator", "current_time", "test__echo", "test__write_note"} <= set(tools)
    assert "test__fail" not in tools  # deny: never offered
    assert tools["test__write_note"].approval == "ask"
    assert tools["test__echo"].approval == "allow"


async def test_the_tools_page_lists_servers_states_tools_and_policies(
    web_client_factory: MakeClient, tmp_path: Path
):
    broken = McpServerConfig(name="broken", command=str(tmp_path / "no-such-server"))
    config = AppConfig(mcp_servers=(stdio_server(tmp_path, tools={"fail": "deny"}), broken))
    client = await web_client_factory(model=ScriptedModel([]), config=config)

    async def failed() -> bool:
        return client.web.agents.servers.states["broken"].status == "failed"  # type: ignore[union-attr]

    await eventually(failed, 10, "the broken server to fail")
    chat = await client.page(await client.new_chat())
    [link] = [a for a in chat.find_all("a") if a.norm_text() == "Tools"]
    response = await client.http.get(link.attrs["href"] or "")
    assert response.status_code == 200
    page = parse_html(response.text)
    test = page.find(data_server="test")
    assert test.attrs["data-status"] == "connected"
    policies = {
        r.attrs["data-tool"]: r.find(class_="policy").norm_text()
        for r in test.find_all("tr", data_tool=True)
    }
    assert policies["test__echo"] == "allow · read-only"
    assert policies["test__write_note"] == "ask"
    assert policies["test__set_flag"] == "ask · idempotent"
    assert policies["test__fail"] == "deny · read-only"  # never offered, still listed
    broken_server = page.find(data_server="broken")
    assert broken_server.attrs["data-status"] == "failed"
    assert "command not found" in broken_server.find(class_="server-error").norm_text()
    builtin = {r.attrs["data-tool"] for r in page.find_all("tr", data_tool=True)} - set(policies)
    assert builtin == {"calculator", "current_time"}
    head = await client.http.head("/tools")
    assert head.status_code == 200


async def test_the_tools_page_without_servers_says_how_to_add_them(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]))
    page = parse_html((await client.http.get("/tools")).text)
    assert "No MCP servers are configured" in page.norm_text()


def test_the_cli_reads_the_config_file_and_refuses_a_wrong_one(tmp_path: Path):
    good = tmp_path / "webapp.toml"
    good.write_text(
        f'[mcp_servers.test]\ncommand = "{sys.executable}"\nargs = ["{SERVER}", "{tmp_path}"]\n'
        'tools = { fail = "deny" }\n'
    )
    [server] = load_config(good).mcp_servers
    assert server.tools == {"fail": "deny"}
    from webapp.__main__ import main, parse_args

    assert parse_args(["--config", str(good)]).config == str(good)
    bad = tmp_path / "bad.toml"
    bad.write_text('[mcp_servers.test]\nurl = "ftp://nowhere"\n')
    assert main(["--config", str(bad), "--port", "0"]) == 2


async def test_start_up_resumes_owed_runs_once_the_servers_are_connected(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    run_id = "0d" * 16
    chats, checkpoints = ChatStore(db), SQLiteCheckpointer(db, wal=True)
    try:  # a process killed while test__echo (read-only: re-run after a crash) ran
        chat = await chats.create(EVERY_CHAT, "crashed")
        await chats.begin_run(chat.id, NewRun(run_id, input="echo", owner=EVERY_CHAT))
        call = ToolCallEntry("call_1", "test__echo", '{"text": "still here"}')
        head = RunHead("assistant", turns=1, session_id=chat.id)
        await checkpoints.append(run_id, [UserEntry("echo"), call], head)
    finally:
        await chats.close()
        await checkpoints.close()
    config = AppConfig(mcp_servers=(stdio_server(tmp_path),))
    client = await web_client_factory(db=db, model=ScriptedModel(["Echoed."]), config=config)
    await client.wait_idle(chat.id)
    [segment] = await client.web.session.segments(chat.id)
    results = [e for e in segment.entries if isinstance(e, ToolResultEntry)]
    assert results == [ToolResultEntry("call_1", "still here")]
