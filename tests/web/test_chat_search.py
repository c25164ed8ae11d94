"""SPEC §8 search: FTS5 over titles and every message of every version, in step with
every change, safe for any query text."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path

import httpx
from webhelpers import HX, MakeClient, parse_html, sqlite_chats_schema_as_of

from webapp.chats import search as chat_search
from webapp.chats.store import ChatStore
from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel
from webapp.transcript import AssistantEntry

ROOT = Path(__file__).resolve().parents[2]
# main before versions and search existed: its database is what the migration meets.
OLD_MAIN = "14158e1"
WORDS = " ".join(f"w{i}" for i in range(1, 200))


async def found(client, query: str) -> list[str]:
    """Chat ids the search answers with, in order (htmx fragment, parsed)."""
    response = await client.http.get("/search", params={"q": query}, headers=HX)
    assert response.status_code == 200, response.text
    page = parse_html(response.text)
    lists = page.find_all("ul", aria_label="Search results")
    if not lists:
        return []
    return [a.attrs["href"].rsplit("/", 1)[1] for a in lists[0].find_all("a")]


def index_rows(db: Path) -> list[tuple[str, str, str, str]]:
    with sqlite3.connect(db) as conn:
        return sorted(
            conn.execute(
                "SELECT d.chat_id, d.run_id, d.source, f.body FROM search_docs d "
                "JOIN chat_search f ON f.rowid = d.id"
            ).fetchall()
        )


def rebuilt_rows(db: Path, tmp: Path) -> list[tuple[str, str, str, str]]:
    """The index as a rebuild from the stored data would make it."""
    copy = tmp / "rebuilt.db"
    with sqlite3.connect(db) as source, sqlite3.connect(copy) as target:
        source.backup(target)
        target.executescript(chat_search.REBUILD)
    rows = index_rows(copy)
    copy.unlink()
    return rows


async def test_search_finds_replies_old_versions_and_titles_newest_first(
    web_client_factory: MakeClient,
):
    model = ScriptedModel(["Zebras have stripes.", "Horses do not.", "Still zebras.", "Okapis."])
    client = await web_client_factory(model=model)
    older = await client.new_chat()
    await client.send(older, "tell me about zebras")
    await client.wait_idle(older)
    newer = await client.new_chat()
    await client.send(newer, "and horses?")
    await client.wait_idle(newer)
    assert await found(client, "stripes") == [older]  # only in a reply
    await client.send(older, "zebra again")  # older becomes the most recently active
    await client.wait_idle(older)
    assert await found(client, "zebras") == [older]
    response = await client.http.get("/search", params={"q": "do"}, headers=HX)
    excerpt = parse_html(response.text).find(class_="excerpt")
    assert [m.text() for m in excerpt.find_all("mark")] == ["do"]
    # A word only in an old version: the reply regenerated away.
    run = (await client.web.session.segments(newer))[0].run_id
    await client.http.post(f"/chats/{newer}/regenerate", data={"run_id": run})
    await client.wait_idle(newer)
    assert await found(client, "Horses") == [newer]
    assert await found(client, "okapis") == [newer]
    # Titles; prefixes as you type; most recently active first.
    await client.http.post(f"/chats/{older}/rename", data={"title": "Savanna notes"})
    assert await found(client, "savan") == [older]
    assert await found(client, "") == []
    # A deleted chat is gone from the results.
    await client.http.post(f"/chats/{older}/delete")
    assert await found(client, "stripes") == []
    assert await found(client, "savanna") == []


async def test_the_index_stays_in_step_with_every_operation(
    web_client_factory: MakeClient, tmp_path: Path
):
    model = ScriptedModel(["alpha reply", "beta reply", WORDS, "gamma reply", "delta reply"])
    client = await web_client_factory(model=model)
    chat_id = await client.new_chat()
    steps = []

    async def check(step: str) -> None:
        steps.append(step)
        assert index_rows(client.db) == rebuilt_rows(client.db, tmp_path), steps

    await client.send(chat_id, "first")
    await client.wait_idle(chat_id)
    await check("append")
    first = (await client.web.session.segments(chat_id))[0].run_id
    await client.http.post(f"/chats/{chat_id}/messages/{first}/edit", data={"text": "edited"})
    await client.wait_idle(chat_id)
    await check("edit (rewind + archive)")
    await client.send(chat_id, "long one")
    await client.wait_text(chat_id, 10)
    run = await client.active_run(chat_id)
    await client.http.post(f"/chats/{chat_id}/runs/{run}/stop")
    await check("stop")
    await client.http.post(f"/chats/{chat_id}/switch", data={"run_id": first})
    await check("switch")
    await client.http.post(f"/chats/{chat_id}/regenerate", data={"run_id": first})
    await client.wait_idle(chat_id)
    await check("regenerate")
    exported = await client.http.get(f"/chats/{chat_id}/export.json")
    imported = await client.http.post(
        "/chats/import", files={"file": ("c.json", exported.content, "application/json")}
    )
    assert imported.status_code == 303
    await check("import")
    await client.http.post(f"/chats/{chat_id}/rename", data={"title": "renamed"})
    await check("rename")
    await client.web.session.trim_tool_results(chat_id, keep_chars=1, keep_runs=0)  # type: ignore[attr-defined]
    await check("trim")
    await client.http.post(f"/chats/{chat_id}/delete")
    await check("delete")
    assert {row[0] for row in index_rows(client.db)} == {
        imported.headers["location"].rsplit("/", 1)[1]
    }


async def test_any_query_text_is_safe(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(['He said "hi" (AND left) *']))
    chat_id = await client.new_chat()
    await client.send(chat_id, "quote test")
    await client.wait_idle(chat_id)
    hostile = [
        '"',
        '"unbalanced',
        "AND OR NOT",
        "NEAR(a b",
        "col:hi",
        "*",
        "^hi",
        "hi -x",
        "{a b}",
        "<script>alert(1)</script>",
        "x" * 5000,
        "left " * 1000,
        "\u0000\u202e",
    ]
    for query in hostile:
        for headers in (HX, {}):
            response = await client.http.get("/search", params={"q": query}, headers=headers)
            assert response.status_code == 200, query[:40]
            assert "<script>alert" not in response.text
    assert await found(client, '"hi" (AND') == [chat_id]  # operators are words here
    page = await client.http.get("/search", params={"q": "<b>bold</b>"})
    assert page.status_code == 200
    box = parse_html(page.text).find("input", id="search-box")
    assert box.attrs["value"] == "<b>bold</b>"  # shown back as text


async def test_search_works_without_javascript(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["Pelicans fly low."]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "birds")
    await client.wait_idle(chat_id)
    page = parse_html((await client.http.get("/")).text)
    form = page.find("form", role="search")
    assert form.attrs["method"] == "get" and form.attrs["action"] == "/search"
    label = page.find("label", **{"for": "search-box"})
    assert label.norm_text() == "Search chats"
    result = parse_html((await client.http.get("/search?q=pelican")).text)
    links = result.find("ul", aria_label="Search results").find_all("a")
    assert [a.attrs["href"] for a in links] == [f"/chats/{chat_id}"]
    assert "1 chat matches" in result.find("main").find(role="status").norm_text()


async def test_the_live_answer_updates_the_search_status_in_place(web_client_factory: MakeClient):
    """SPEC §18: as you type, one role="status" element that stays in the page says how
    many chats match; htmx's answer swaps only its text (out of band)."""
    client = await web_client_factory(model=ScriptedModel(["Pelicans fly low."]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "birds")
    await client.wait_idle(chat_id)
    home = parse_html((await client.http.get("/")).text).find(id="search-status")
    assert home.attrs["role"] == "status" and "hx-swap-oob" not in home.attrs
    assert home.norm_text() == ""
    for query, said in (("pelican", "1 chat matches"), ("heron", "No chat matches")):
        answer = await client.http.get("/search", params={"q": query}, headers=HX)
        status = parse_html(answer.text).find(id="search-status")
        assert status.attrs["hx-swap-oob"] == "innerHTML" and status.attrs["role"] == "status"
        assert status.norm_text() == said


def _old_main(tmp: Path) -> Path:
    """The package as it was before versions and search, unpacked from git."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", OLD_MAIN, "webapp", "templates", "static"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    target = tmp / "old-main"
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        # Our own archive; the filter argument came with 3.11.4 (Debian 12 has 3.11.2).
        if hasattr(tarfile, "data_filter"):
            tar.extractall(target, filter="data")
        else:
            tar.extractall(target)
    return target


def _old_server_chat(old: Path, db: Path, port: int) -> str:
    """Run the old app, send one message through it, wait for the reply; the chat id."""
    env = {**os.environ, "PYTHONPATH": str(old)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "webapp", "--port", str(port), "--db", str(db)]
        + ["--offline-delay", "0"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=old,
    )
    try:
        deadline = time.monotonic() + 20
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            while True:
                try:
                    created = http.post("/chats", data={"text": "Tell me about narwhals"})
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and proc.poll() is None
                    time.sleep(0.1)
            chat_id = created.headers["location"].rsplit("/", 1)[1]
            while (
                "narwhals"
                not in http.get(f"/chats/{chat_id}").text.split('data-role="assistant"')[-1]
            ):
                assert time.monotonic() < deadline
                time.sleep(0.1)
        return chat_id
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_a_database_made_by_the_previous_main_is_searchable_and_exportable(
    web_client_factory: MakeClient, tmp_path: Path
):
    from socket import socket

    with socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    db = tmp_path / "old.db"
    old = await asyncio.to_thread(_old_main, tmp_path)
    chat_id = await asyncio.to_thread(_old_server_chat, old, db, port)
    client = await web_client_factory(db=db, model=ScriptedModel(["A new reply."]))
    assert await found(client, "narwhals") == [chat_id]
    exported = (await client.http.get(f"/chats/{chat_id}/export.json")).json()
    assert len(exported["runs"]) == 1
    assert exported["runs"][0]["entries"][0] == {"type": "user", "text": "Tell me about narwhals"}
    # Versions work on it too, and the old reply stays searchable as an old version.
    run = exported["runs"][0]["run_id"]
    await client.http.post(f"/chats/{chat_id}/regenerate", data={"run_id": run})
    await client.wait_idle(chat_id)
    assert await found(client, "narwhals") == [chat_id]
    assert (
        json.loads((await client.http.get(f"/chats/{chat_id}/export.json")).text)["runs"][1][
            "message_id"
        ]
        == run
    )


async def test_the_text_after_a_nul_is_indexed(web_client_factory: MakeClient, tmp_path: Path):
    # A model may write a NUL; json_extract would end the text there (issue 21).
    client = await web_client_factory(model=ScriptedModel(["before\u0000after \\u0000literal"]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "run it")
    await client.wait_idle(chat_id)
    segments = await client.web.session.segments(chat_id)
    assert segments[0].entries[1] == AssistantEntry("before\u0000after \\u0000literal")
    assert await found(client, "after") == [chat_id]
    assert await found(client, "u0000literal") == [chat_id]  # typed text stays text
    assert index_rows(client.db) == rebuilt_rows(client.db, tmp_path)


async def test_a_query_typed_with_a_combining_accent_finds_the_composed_word(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(model=ScriptedModel(["ok"]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "notre \u00e9cole")
    await client.wait_idle(chat_id)
    assert await found(client, "e\u0301cole") == [chat_id]  # "e" + COMBINING ACUTE ACCENT
    assert await found(client, "e\u0301co") == [chat_id]


async def test_private_use_markers_in_a_message_are_not_marks(
    web_client_factory: MakeClient, tmp_path: Path
):
    client = await web_client_factory(model=ScriptedModel(["ok"]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "zebras \ue000fake\ue001 mark")
    await client.wait_idle(chat_id)
    response = await client.http.get("/search", params={"q": "zebras"}, headers=HX)
    excerpt = parse_html(response.text).find(class_="excerpt")
    assert [m.text() for m in excerpt.find_all("mark")] == ["zebras"]
    assert excerpt.text() == "zebras fake mark ok"  # the markers are spaces in the index
    assert index_rows(client.db) == rebuilt_rows(client.db, tmp_path)


def test_an_index_made_before_the_nul_fix_is_rebuilt(tmp_path: Path):
    """Schema version 6 indexed text up to a NUL and kept the markers: the migration
    brings in the new triggers and fills the index again."""
    db = tmp_path / "chat.db"
    asyncio.run(_open(db))
    entries = json.dumps([{"type": "user", "text": "before\u0000after \ue000x"}])
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO chats (id, title, created_at, updated_at) VALUES ('c1', 't', 1, 1)"
        )
        conn.execute(
            "INSERT INTO session_segments (session_id, seq, run_id, first_entry, entry_count, "
            "entries_json, meta_json) VALUES ('c1', 1, 'r1', 0, 1, ?, NULL)",
            (entries,),
        )
        conn.execute("UPDATE chat_search SET body = 'before \ue000x'")  # what version 6 made
        # What later versions added, gone too, so their steps meet a version 6 file.
        sqlite_chats_schema_as_of(conn, 6)
    asyncio.run(_open(db))
    with sqlite3.connect(db) as conn:
        bodies = sorted(b for (b,) in conn.execute("SELECT body FROM chat_search"))
    assert bodies == ["before after  x", "t"]


async def _open(db: Path) -> None:
    async with ChatStore(db) as store:
        await store.recent(EVERY_CHAT, 1)
