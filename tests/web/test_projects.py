"""SPEC §15 projects through the routes: make one, its page, moving chats in and out,
instructions, rename, delete (its chats stay) and export/import by name, on SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import re

import httpx
from people import HTML, rows
from webhelpers import MakeClient, Node, WebClient, parse_html

from webapp.chats.users import EVERY_CHAT

ON_BOTH_DATABASES = True


async def _new_project(http: httpx.AsyncClient, name: str) -> str:
    made = await http.post("/projects", data={"name": name})
    assert made.status_code == 303, made.text
    found = re.search(r"/projects/([0-9a-f]{32})$", made.headers["location"])
    assert found, made.headers["location"]
    return found.group(1)


async def _page(http: httpx.AsyncClient, path: str) -> Node:
    response = await http.get(path, headers=HTML)
    assert response.status_code == 200, (path, response.status_code)
    return parse_html(response.text)


def _project_chats(page: Node) -> list[str]:
    return [a.attrs["href"] or "" for a in page.find("ul", class_="project-chats").find_all("a")]


async def test_a_project_keeps_chats_and_gives_them_its_instructions(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(offline_delay=0)
    http = client.http
    project = await _new_project(http, "  Garden   plans ")
    nav = (await _page(http, "/")).find("nav", aria_label="Projects")
    assert [a.norm_text() for a in nav.find_all("a")] == ["Garden plans"]

    made = await http.post(f"/projects/{project}/chats")
    assert made.status_code == 303
    chat_id = made.headers["location"].rsplit("/", 1)[1]
    assert _project_chats(await _page(http, f"/projects/{project}")) == [f"/chats/{chat_id}"]
    select = (await _page(http, f"/chats/{chat_id}")).find("select", id="chat-project")
    chosen = [o.attrs["value"] for o in select.find_all("option") if "selected" in o.attrs]
    assert chosen == [project]

    saved = await http.post(f"/projects/{project}/instructions", data={"instructions": "Be terse."})
    assert saved.status_code == 303
    page = await _page(http, f"/projects/{project}")
    assert page.find("textarea", id="project-instructions").text() == "Be terse."
    agent = await client.web.agents.chat_agent(chat_id)
    assert isinstance(agent.instructions, str) and agent.instructions.startswith("Be terse.\n\n")
    await http.post(f"/chats/{chat_id}/instructions", data={"instructions": "Say hi."})
    agent = await client.web.agents.chat_agent(chat_id)
    assert agent.instructions == "Be terse.\n\nSay hi."

    # Out of the project (the select's empty choice), and in again.
    assert (
        await http.post(f"/chats/{chat_id}/project", data={"project_id": ""})
    ).status_code == 303
    assert _project_chats(await _page(http, f"/projects/{project}")) == []
    assert (await client.web.agents.chat_agent(chat_id)).instructions == "Say hi."
    await http.post(f"/chats/{chat_id}/project", data={"project_id": project})
    assert _project_chats(await _page(http, f"/projects/{project}")) == [f"/chats/{chat_id}"]

    renamed = await http.post(f"/projects/{project}/rename", data={"name": "Allotment"})
    assert renamed.status_code == 303
    assert (await _page(http, f"/projects/{project}")).find("h1").norm_text() == "Allotment"

    assert (await http.post(f"/projects/{project}/delete")).status_code == 303
    assert (await http.get(f"/projects/{project}", headers=HTML)).status_code == 404
    assert await client.web.chats.get(EVERY_CHAT, chat_id) is not None  # the chat stays
    assert await rows(client.db, "SELECT project_id FROM chats WHERE id = ?", chat_id) == [(None,)]


async def test_bad_names_and_unknown_projects_say_so(web_client_factory: MakeClient):
    client = await web_client_factory()
    empty = await client.http.post("/projects", data={"name": "   "}, headers=HTML)
    assert empty.status_code == 400 and "needs a name" in empty.text
    long = await client.http.post("/projects", data={"name": "x" * 201}, headers=HTML)
    assert long.status_code == 400 and "limit is 200" in long.text
    assert await rows(client.db, "SELECT * FROM projects") == []
    chat_id = await client.new_chat()
    moved = await client.http.post(f"/chats/{chat_id}/project", data={"project_id": "nope"})
    assert moved.status_code == 404
    assert (await client.http.get("/projects/nope", headers=HTML)).status_code == 404


async def test_export_and_import_carry_the_projects_name(web_client_factory: MakeClient):
    client = await web_client_factory(offline_delay=0)
    project = await _new_project(client.http, "Taxes")
    made = await client.http.post(f"/projects/{project}/chats")
    chat_id = made.headers["location"].rsplit("/", 1)[1]
    await _send_and_wait(client, chat_id, "hello")
    exported = await client.http.get(f"/chats/{chat_id}/export.json")
    document = json.loads(exported.text)
    assert document["project"] == "Taxes"
    imported = await client.http.post(
        "/chats/import", files={"file": ("c.json", exported.content, "application/json")}
    )
    copy = imported.headers["location"].rsplit("/", 1)[1]
    assert await rows(client.db, "SELECT project_id FROM chats WHERE id = ?", copy) == [(project,)]
    # Without a project of that name, the import is outside every project.
    await client.http.post(f"/projects/{project}/delete")
    again = await client.http.post(
        "/chats/import", files={"file": ("c.json", exported.content, "application/json")}
    )
    other = again.headers["location"].rsplit("/", 1)[1]
    assert await rows(client.db, "SELECT project_id FROM chats WHERE id = ?", other) == [(None,)]
    document["project"] = 5
    bad = await client.http.post(
        "/chats/import",
        files={"file": ("c.json", json.dumps(document).encode(), "application/json")},
    )
    assert bad.status_code == 400 and "project" in bad.text


async def _send_and_wait(client: WebClient, chat_id: str, text: str) -> None:
    await client.send(chat_id, text)
    await client.wait_idle(chat_id)
