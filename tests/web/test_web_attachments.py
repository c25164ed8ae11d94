"""Attachments (SPEC §14): sent, shown, downloaded, sent to the model, kept by versions,
refused by name when hostile, found by search, freed with the chat."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from attachment_files import PNG, docx_file, pdf, zip_bomb
from webhelpers import MakeClient, WebClient, buttons, form_of, messages, replies, reply_text

from webapp.chats.intake import AttachmentLimits
from webapp.chats.users import EVERY_CHAT
from webapp.models.chat_request import build_messages
from webapp.runtime.model import FinishPart, ModelPart, ModelRequest, TextPart
from webapp.transcript import UserEntry

ON_BOTH_DATABASES = True

TABLES = (
    "attachment_files",
    "attachment_chunks",
    "message_files",
    "run_files",
    "session_segments",
    "chat_runs",
    "run_inputs",
)


class RecordingModel:
    """Answers "ok" and keeps the Chat Completions messages of every request."""

    def __init__(self) -> None:
        self.requests: list[list[dict[str, Any]]] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        self.requests.append(build_messages(request.system, request.entries))
        yield TextPart("ok")
        yield FinishPart("stop")


def files(*items: tuple[str, bytes]) -> list[tuple[str, tuple[str, bytes, str]]]:
    # The browser's claimed type is always a lie here: the bytes must decide.
    return [("files", (name, data, "application/octet-stream")) for name, data in items]


async def send(client: WebClient, chat_id: str, text: str, *attached: tuple[str, bytes]) -> Any:
    return await client.http.post(
        f"/chats/{chat_id}/messages", data={"text": text}, files=files(*attached)
    )


async def counts(client: WebClient) -> dict[str, int]:
    store = client.web.store

    async def count(tx: Any) -> dict[str, int]:
        found = {}
        for table in TABLES:
            rows = await tx.fetch(f"SELECT COUNT(*) FROM {table}")
            found[table] = int(rows[0][0])
        return found

    return await store._store.read(count)  # the test reads the tables it checks


def user_content(request: list[dict[str, Any]]) -> list[dict[str, Any]]:
    users = [m for m in request if m["role"] == "user"]
    content = users[-1]["content"]
    assert isinstance(content, list), content
    return content


async def test_send_show_download_and_the_offline_model(web_client_factory: MakeClient):
    client = await web_client_factory(offline_delay=0)
    chat_id = await client.new_chat()
    notes = b"\n\nFirst line of the notes\nsecond line\n"
    response = await send(
        client, chat_id, "What is in these?", ("notes.md", notes), ("dot.txt", PNG)
    )
    assert response.status_code == 303, response.text
    await client.wait_idle(chat_id)
    segment = (await client.web.session.segments(chat_id))[0]
    user = segment.entries[0]
    assert isinstance(user, UserEntry)
    assert [(a.name, a.media_type, a.size, a.context) for a in user.attachments] == [
        ("notes.md", "text/plain", len(notes), "whole"),
        ("dot.txt", "image/png", len(PNG), ""),  # judged by its bytes, not its name
    ]
    page = await client.page(chat_id)
    message = messages(page)[0]
    shown = message.find_all(data_role="attachment")
    assert [n.attrs["data-name"] for n in shown] == ["notes.md", "dot.txt"]
    assert shown[0].attrs["data-context"] == "whole"
    assert shown[1].find("img").attrs["alt"] == "dot.txt"
    link = shown[0].find("a").attrs["href"]
    download = await client.http.get(str(link))
    assert download.status_code == 200
    assert download.content == notes
    assert download.headers["content-disposition"].startswith("attachment;")
    text = reply_text(replies(page)[0])
    assert f"Attached: notes.md (text/plain, {len(notes)} bytes)" in text
    assert "notes.md begins: First line of the notes" in text
    assert f"Attached: dot.txt (image/png, {len(PNG)} bytes)" in text
    # Another chat does not hold the file: 404, as for anyone else's.
    other = await client.new_chat()
    assert (await client.http.get(str(link).replace(chat_id, other))).status_code == 404


async def test_the_model_gets_image_parts_and_whole_text(web_client_factory: MakeClient):
    model = RecordingModel()
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    doc = docx_file("Quarterly report\nRevenue grew")
    response = await send(client, chat_id, "Summarise", ("r.docx", doc), ("p.png", PNG))
    assert response.status_code == 303, response.text
    await client.wait_idle(chat_id)
    content = user_content(model.requests[-1])
    assert content[0] == {"type": "text", "text": "Summarise"}
    assert content[1] == {"type": "text", "text": "[r.docx]\nQuarterly report\nRevenue grew"}
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert content[2] == {"type": "image_url", "image_url": {"url": url}}
    # Regenerate sends the same.
    response = await client.http.post(f"/chats/{chat_id}/regenerate")
    assert response.status_code == 303
    await client.wait_idle(chat_id)
    assert user_content(model.requests[-1]) == content


async def test_a_long_document_goes_as_the_relevant_pages(web_client_factory: MakeClient):
    model = RecordingModel()
    limits = AttachmentLimits(context_chars=2_000)
    client = await web_client_factory(model=model, attachment_limits=limits)
    chat_id = await client.new_chat()
    filler = "\n".join(f"ordinary line {i} about nothing" for i in range(40))
    pages = [filler, filler + "\nthe zebra crossing is here", filler, "giraffe facts\n" + filler]
    response = await send(client, chat_id, "zebra location", ("animals.pdf", pdf(pages)))
    assert response.status_code == 303, response.text
    await client.wait_idle(chat_id)
    sent = user_content(model.requests[-1])[1]["text"]
    assert sent.startswith("[animals.pdf, page 2]\n")
    assert "zebra crossing" in sent
    assert "page 1]" not in sent and "page 3]" not in sent and "giraffe" not in sent
    page = await client.page(chat_id)
    shown = messages(page)[0].find(data_role="attachment")
    assert shown.attrs["data-context"] == "excerpts"


async def test_edit_keeps_the_checked_files_and_takes_new_ones(web_client_factory: MakeClient):
    model = RecordingModel()
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    await send(client, chat_id, "Two files", ("a.txt", b"alpha text"), ("b.txt", b"beta text"))
    await client.wait_idle(chat_id)
    run_id = (await client.web.session.segments(chat_id))[0].run_id
    form_page = await client.http.get(f"/chats/{chat_id}/messages/{run_id}/edit")
    form = form_of(buttons(parse(form_page.text), "Save and send")[0])
    labels = [n.norm_text() for n in form.find_all("label")]
    assert "Keep a.txt" in labels and "Keep b.txt" in labels
    response = await client.http.post(
        f"/chats/{chat_id}/messages/{run_id}/edit",
        data={"text": "Now these", "keep_listed": "1", "keep": "b.txt"},
        files=files(("c.txt", b"gamma text")),
    )
    assert response.status_code == 303, response.text
    await client.wait_idle(chat_id)
    user = (await client.web.session.segments(chat_id))[0].entries[0]
    assert isinstance(user, UserEntry)
    assert [a.name for a in user.attachments] == ["b.txt", "c.txt"]
    texts = [p["text"] for p in user_content(model.requests[-1])]
    assert texts == ["Now these", "[b.txt]\nbeta text", "[c.txt]\ngamma text"]


def parse(text: str) -> Any:
    from webhelpers import parse_html

    return parse_html(text)


HOSTILE = {
    "too large": ("big.txt", b"x" * (1024 * 1024 + 1), "the limit is 1 MB"),
    "an executable named .png": (
        "cat.png",
        b"\x7fELF\x02\x01\x01\x00" + bytes(200),
        "not an image",
    ),
    "an encrypted PDF": ("secret.pdf", pdf(["hidden"], password="pw"), "encrypted"),
    "a corrupt PDF": ("broken.pdf", b"%PDF-1.7\n1 0 obj << /Type /Catalog", "damaged"),
    "too many pages": ("long.pdf", pdf(["a", "b", "c"]), "3 pages; the limit is 2"),
    "a zip bomb named .docx": ("bomb.docx", zip_bomb(), "zip bomb"),
    "text that is not UTF-8": ("latin.txt", "caf\u00e9 cr\u00e8me".encode("latin-1"), "not UTF-8"),
}


@pytest.mark.parametrize("case", [*HOSTILE, "an 11th file"])
async def test_hostile_files_are_refused_by_name_and_nothing_is_written(
    web_client_factory: MakeClient, case: str
):
    limits = AttachmentLimits(max_mb=1, max_pdf_pages=2)
    client = await web_client_factory(offline_delay=0, attachment_limits=limits)
    chat_id = await client.new_chat()
    before = await counts(client)
    if case == "an 11th file":
        attached = [(f"f{i}.txt", b"fine") for i in range(1, 12)]
        name, reason = "f11.txt", "at most 10 files"
    else:
        name, data, reason = HOSTILE[case]
        attached = [("fine.txt", b"fine"), (name, data)]
    response = await send(client, chat_id, "Look", *attached)
    assert response.status_code == 400
    page = parse(response.text)
    alert = page.find(role="alert")
    assert name in alert.text() and reason in alert.text(), alert.text()
    assert await counts(client) == before
    assert await client.web.session.segments(chat_id) == []


async def test_a_name_with_path_and_html_is_data(web_client_factory: MakeClient):
    client = await web_client_factory(offline_delay=0)
    chat_id = await client.new_chat()
    # (A browser sends a double quote in a file name as %22: that is the name it gets.)
    name = "../<img src=x onerror=alert(1)>.txt"
    response = await send(client, chat_id, "Name", (name, b"harmless"))
    assert response.status_code == 303, response.text
    await client.wait_idle(chat_id)
    raw = (await client.http.get(f"/chats/{chat_id}")).text
    assert "<img src=x" not in raw  # escaped wherever it is shown
    shown = messages(parse(raw))[0].find(data_role="attachment")
    assert shown.attrs["data-name"] == name
    download = await client.http.get(str(shown.find("a").attrs["href"]))
    disposition = download.headers["content-disposition"]
    assert "/" not in disposition.split("filename*")[0] and "<" not in disposition


async def test_search_finds_words_inside_documents_and_delete_frees_them(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(offline_delay=0)
    kept = await client.new_chat()
    gone = await client.new_chat()
    shared = b"shared document about marmalade"
    await send(client, kept, "First", ("shared.txt", shared))
    await client.wait_idle(kept)
    await send(
        client, gone, "Second", ("shared.txt", shared), ("own.txt", b"only here:\nporcupine")
    )
    await client.wait_idle(gone)
    found = await client.web.chats.search(EVERY_CHAT, "porcupine")
    assert [h.chat_id for h in found] == [gone]
    page = parse((await client.http.get("/search", params={"q": "porcupine"})).text)
    hit = page.find(class_="excerpt")
    assert hit.find("cite").text() == "own.txt"  # the hit names the file
    assert hit.find("mark").text() == "porcupine"
    assert (await counts(client))["attachment_files"] == 2
    response = await client.http.post(f"/chats/{gone}/delete")
    assert response.status_code in (200, 303)
    after = await counts(client)
    assert after["attachment_files"] == 1  # the shared file stays with the other chat
    assert await client.web.chats.search(EVERY_CHAT, "porcupine") == []
    assert [h.chat_id for h in await client.web.chats.search(EVERY_CHAT, "marmalade")] == [kept]


async def test_export_carries_the_bytes_and_import_restores_them(web_client_factory: MakeClient):
    client = await web_client_factory(offline_delay=0)
    chat_id = await client.new_chat()
    await send(client, chat_id, "Keep this", ("report.txt", b"the report's text"), ("p.png", PNG))
    await client.wait_idle(chat_id)
    markdown = (await client.http.get(f"/chats/{chat_id}/export.md")).text
    assert "*Attached: report.txt*" in markdown and "*Attached: p.png*" in markdown
    exported = await client.http.get(f"/chats/{chat_id}/export.json")
    document = exported.json()
    assert sorted((f["name"], base64.b64decode(f["data"])) for f in document["files"]) == [
        ("p.png", PNG),
        ("report.txt", b"the report's text"),
    ]
    await client.http.post(f"/chats/{chat_id}/delete")
    assert (await counts(client))["attachment_files"] == 0
    imported = await client.http.post(
        "/chats/import", files={"file": ("c.json", exported.content, "application/json")}
    )
    assert imported.status_code == 303, imported.text
    new_id = imported.headers["location"].rsplit("/", 1)[1]
    shown = messages(await client.page(new_id))[0].find_all(data_role="attachment")
    assert [n.attrs["data-name"] for n in shown] == ["report.txt", "p.png"]
    download = await client.http.get(str(shown[0].find("a").attrs["href"]))
    assert download.content == b"the report's text"
    # A file that would be refused as an upload is refused in an import too.
    for item in document["files"]:
        if item["name"] == "report.txt":
            bad = "caf\u00e9".encode("latin-1")
            item["data"] = base64.b64encode(bad).decode()
            item["id"] = hashlib.sha256(bad).hexdigest()
    for run in document["runs"]:
        for attachment in run["entries"][0].get("attachments", []):
            if attachment["name"] == "report.txt":
                attachment["id"] = hashlib.sha256("caf\u00e9".encode("latin-1")).hexdigest()
    before = await counts(client)
    refused = await client.http.post(
        "/chats/import",
        files={"file": ("c.json", json.dumps(document).encode(), "application/json")},
    )
    assert refused.status_code == 400
    assert "report.txt" in refused.text and "not UTF-8" in refused.text
    assert await counts(client) == before


async def test_files_alone_branch_and_the_command_line_import(
    web_client_factory: MakeClient, tmp_path: Path, db_kind: str
):
    client = await web_client_factory(offline_delay=0)
    chat_id = await client.new_chat()
    response = await client.http.post(
        f"/chats/{chat_id}/messages", data={"text": "  "}, files=files(("only.txt", b"just this"))
    )
    assert response.status_code == 303, response.text  # files alone are a message
    await client.wait_idle(chat_id)
    chat = await client.web.chats.get(EVERY_CHAT, chat_id)
    assert chat is not None and chat.title == "only.txt"
    run_id = (await client.web.session.segments(chat_id))[0].run_id
    branched = await client.http.post(f"/chats/{chat_id}/runs/{run_id}/branch")
    branch_id = branched.headers["location"].rsplit("/", 1)[1]
    await client.http.post(f"/chats/{chat_id}/delete")
    shown = messages(await client.page(branch_id))[0].find(data_role="attachment")
    download = await client.http.get(str(shown.find("a").attrs["href"]))
    assert download.content == b"just this"  # the branch still holds the file
    if db_kind != "sqlite":
        return
    exported = tmp_path / "chat.json"
    exported.write_bytes((await client.http.get(f"/chats/{branch_id}/export.json")).content)
    other = tmp_path / "other.db"
    command = [sys.executable, "-m", "webapp", "import", str(exported), "--db", str(other)]
    done = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(done.communicate(), 120)
    assert done.returncode == 0, stderr.decode()
    second = await web_client_factory(db=other, offline_delay=0)
    imported = (await second.web.chats.recent(EVERY_CHAT))[0]
    shown = messages(await second.page(imported.id))[0].find(data_role="attachment")
    assert (await second.http.get(str(shown.find("a").attrs["href"]))).content == b"just this"


async def test_reading_a_file_is_stopped_at_its_time_limit():
    from webapp.chats.file_reading import Unreadable
    from webapp.chats.file_worker import FileReader

    document = pdf(["a page"] * 50)
    read = await FileReader(time_limit=30).read(document, 100)
    assert read.found.paged and len(read.found.pages or ()) == 50
    with pytest.raises(Unreadable, match="longer than 0.001 seconds"):
        await FileReader(time_limit=0.001).read(document, 100)


async def test_the_home_pages_composer_starts_a_chat_with_files(web_client_factory: MakeClient):
    client = await web_client_factory(offline_delay=0)
    response = await client.http.post(
        "/chats", data={"text": "Start here"}, files=files(("first.txt", b"first file"))
    )
    assert response.status_code == 303, response.text
    chat_id = response.headers["location"].rsplit("/", 1)[1]
    await client.wait_idle(chat_id)
    page = await client.page(chat_id)
    assert messages(page)[0].find(data_role="attachment").attrs["data-name"] == "first.txt"
    before = await counts(client)
    refused = await client.http.post(
        "/chats", data={"text": "Again"}, files=files(("bad.txt", b"\xff\xfe bad"))
    )
    assert refused.status_code == 400
    assert "bad.txt" in parse(refused.text).find(role="alert").text()
    assert await counts(client) == before
    assert len(await client.web.chats.recent(EVERY_CHAT)) == 1  # no chat was made
