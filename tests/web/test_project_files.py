"""SPEC §15 project files through the routes: documents of §14 added to a project, what a
chat of it is sent (whole, or excerpts under the budget), refusals, removal and what a
project's delete frees, on SQLite and PostgreSQL."""

from __future__ import annotations

import re

import httpx
from attachment_files import PNG, pdf
from people import HTML, rows
from webhelpers import MakeClient, WebClient, parse_html

from webapp.chats.intake import AttachmentLimits
from webapp.chats.project_files import ProjectFileContext
from webapp.transcript import UserEntry

ON_BOTH_DATABASES = True


async def _project_with_chat(http: httpx.AsyncClient, name: str = "Garden") -> tuple[str, str]:
    made = await http.post("/projects", data={"name": name})
    project = made.headers["location"].rsplit("/", 1)[1]
    chat = (await http.post(f"/projects/{project}/chats")).headers["location"].rsplit("/", 1)[1]
    return project, chat


async def _add(http: httpx.AsyncClient, project: str, *files: tuple[str, bytes]) -> httpx.Response:
    return await http.post(
        f"/projects/{project}/files",
        files=[("files", (name, data, "application/octet-stream")) for name, data in files],
        headers=HTML,
    )


def _context(client: WebClient, chat_id: str, budget: int) -> ProjectFileContext:
    store = client.web.store
    return ProjectFileContext(store.files, store.project_files, chat_id, budget)


async def test_a_projects_documents_reach_its_chats_whole_or_as_excerpts(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(offline_delay=0)
    project, chat_id = await _project_with_chat(client.http)
    notes = b"Plums want full sun.\nPrune them in summer.\n"
    manual = pdf(["Tomatoes need stakes.", "Plum trees fruit in August."])
    added = await _add(client.http, project, ("notes.txt", notes), ("manual.pdf", manual))
    assert added.status_code == 303, added.text
    page = parse_html((await client.http.get(f"/projects/{project}", headers=HTML)).text)
    listed = [li.attrs["data-name"] for li in page.find_all("li", data_role="attachment")]
    assert listed == ["manual.pdf", "notes.txt"] or listed == ["notes.txt", "manual.pdf"]

    asked = [UserEntry("When do plums fruit?")]
    whole = await _context(client, chat_id, 60_000).for_request(asked)
    assert "[notes.txt]\nPlums want full sun." in whole and "Tomatoes need stakes." in whole
    # A budget smaller than the documents: only passages that match, headed with the page.
    picked = await _context(client, chat_id, 40).for_request(asked)
    assert "[manual.pdf, page 2]\nPlum trees fruit in August." in picked
    assert "Tomatoes" not in picked
    # The agent of a chat of the project sends it; a chat outside sends none of it.
    other = await client.new_chat()
    assert await _context(client, other, 60_000).for_request(asked) == ""


async def test_images_and_unreadable_files_are_refused_by_name_and_nothing_is_added(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(attachment_limits=AttachmentLimits(max_mb=0.001))
    project, _ = await _project_with_chat(client.http)
    refused = await _add(client.http, project, ("ok.txt", b"fine"), ("cat.png", PNG))
    assert refused.status_code == 400 and "cat.png" in refused.text and "documents" in refused.text
    big = await _add(client.http, project, ("big.txt", b"x" * 5_000))
    assert big.status_code == 400 and "big.txt" in big.text
    empty = await client.http.post(f"/projects/{project}/files", data={}, headers=HTML)
    assert empty.status_code == 400
    assert await rows(client.db, "SELECT * FROM project_files") == []
    assert await rows(client.db, "SELECT id FROM attachment_files") == []


async def test_removing_and_deleting_free_files_no_chat_holds(web_client_factory: MakeClient):
    client = await web_client_factory(offline_delay=0)
    project, chat_id = await _project_with_chat(client.http)
    await _add(client.http, project, ("a.txt", b"alpha words"), ("b.txt", b"beta words"))
    # b.txt is also attached to a message of the chat: it stays when the project lets go.
    sent = await client.http.post(
        f"/chats/{chat_id}/messages",
        data={"text": "see b"},
        files=[("files", ("b.txt", b"beta words", "text/plain"))],
    )
    assert sent.status_code in (200, 303), sent.text
    await client.wait_idle(chat_id)
    page = (await client.http.get(f"/projects/{project}", headers=HTML)).text
    remove_a = re.search(
        r'action="(/projects/[^"]+/remove)"[^>]*>\s*<input[^>]*value="a.txt"', page
    )
    assert remove_a is not None
    gone = await client.http.post(remove_a.group(1), data={"name": "a.txt"})
    assert gone.status_code == 303
    assert await rows(client.db, "SELECT name FROM project_files") == [("b.txt",)]
    assert len(await rows(client.db, "SELECT id FROM attachment_files")) == 1
    assert (await client.http.post(f"/projects/{project}/delete")).status_code == 303
    assert await rows(client.db, "SELECT * FROM project_files") == []
    assert len(await rows(client.db, "SELECT id FROM attachment_files")) == 1  # the chat's
    assert (await client.http.post(f"/chats/{chat_id}/delete")).status_code == 303
    assert await rows(client.db, "SELECT id FROM attachment_files") == []
