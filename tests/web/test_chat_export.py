"""SPEC §8: the chat file formats (JSON round trip, Markdown) and import validation."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from webhelpers import HX, MakeClient, parse_html

from webapp.chats.file_format import ChatFileError, parse, to_json
from webapp.chats.intake import AttachmentLimits
from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel
from webapp.transcript import AssistantEntry, ToolCallEntry, ToolResultEntry, UserEntry

ON_BOTH_DATABASES = True  # every test here that builds the app runs on SQLite and PostgreSQL


ROOT = Path(__file__).resolve().parents[2]


async def chat_with_versions(client) -> str:
    """A chat with a tool call, an edited first message and a regenerated reply."""
    chat_id = await client.new_chat()
    for text in ("what is 2+2?", "and then?"):
        await client.send(chat_id, text)
        await client.wait_idle(chat_id)
    second = (await client.web.session.segments(chat_id))[1].run_id
    await client.http.post(f"/chats/{chat_id}/regenerate", data={"run_id": second})
    await client.wait_idle(chat_id)
    first = (await client.web.session.segments(chat_id))[0].run_id
    await client.http.post(f"/chats/{chat_id}/messages/{first}/edit", data={"text": "hello"})
    await client.wait_idle(chat_id)
    await client.http.post(f"/chats/{chat_id}/switch", data={"run_id": first})
    return chat_id


def model() -> ScriptedModel:
    return ScriptedModel(
        [
            [("calculator", {"expression": "2+2"})],
            "It is **4**.",
            "Then nothing.",
            "Then more.",
            "Hi!",
            "imported reply",
        ]
    )


def normalised(document: dict[str, Any]) -> Any:
    """The document without times, with ids replaced by their order of appearance."""
    ids: dict[str, str] = {}

    def walk(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items() if not k.endswith("_at")}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if key.endswith("_id") and isinstance(value, str):
            return ids.setdefault(value, f"id{len(ids)}")
        return value

    return walk(document)


async def test_json_export_import_round_trip(web_client_factory: MakeClient):
    client = await web_client_factory(model=model())
    chat_id = await chat_with_versions(client)
    response = await client.http.get(f"/chats/{chat_id}/export.json")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.headers["content-disposition"].startswith("attachment; filename=")
    exported = response.json()
    assert exported["format_version"] == 1
    assert len(exported["runs"]) == 4  # two versions of each
    kinds = [[e["type"] for e in r["entries"]] for r in exported["runs"]]
    assert ["user", "tool_call", "tool_result", "assistant"] in kinds
    imported = await client.http.post(
        "/chats/import", files={"file": ("chat.json", response.content, "application/json")}
    )
    assert imported.status_code == 303
    new_id = imported.headers["location"].rsplit("/", 1)[1]
    assert new_id != chat_id
    again = (await client.http.get(f"/chats/{new_id}/export.json")).json()
    assert normalised(again) == normalised(exported)
    assert again["chat_id"] == new_id and not {r["run_id"] for r in again["runs"]} & {
        r["run_id"] for r in exported["runs"]
    }
    # The imported chat shows the same path, and sending there continues from it.
    shown = [s.entries for s in await client.web.session.segments(chat_id)]
    assert [s.entries for s in await client.web.session.segments(new_id)] == shown
    await client.send(new_id, "go on")
    await client.wait_idle(new_id)
    segments = await client.web.session.segments(new_id)
    assert segments[-1].entries == [UserEntry("go on"), AssistantEntry("imported reply")]


async def test_markdown_export_is_the_shown_conversation(web_client_factory: MakeClient):
    client = await web_client_factory(model=model())
    chat_id = await chat_with_versions(client)
    response = await client.http.get(f"/chats/{chat_id}/export.md")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/markdown")
    # Editing the first message renamed the chat after it (the automatic title).
    assert response.headers["content-disposition"] == 'attachment; filename="hello.md"'
    text = response.text
    assert text.startswith("# hello\n")
    assert "## You\n\nwhat is 2+2?" in text
    assert "**Tool call** `calculator`\n\n```json\n" in text and '"expression": "2+2"' in text
    assert "**Tool result**\n\n```\n4\n```" in text
    assert "It is **4**." in text and "Then more." in text
    assert "Then nothing." not in text and "## You\n\nhello" not in text  # JSON only
    missing = await client.http.get("/chats/" + "0" * 32 + "/export.md")
    assert missing.status_code == 404


VALID = {
    "format_version": 1,
    "title": "t",
    "runs": [
        {
            "run_id": "a",
            "parent_run_id": None,
            "message_id": "a",
            "selected": 1,
            "entries": [{"type": "user", "text": "hi"}, {"type": "assistant", "text": "yo"}],
            "meta": None,
        }
    ],
}


def with_run(**changes: Any) -> bytes:
    run = {**VALID["runs"][0], **changes}  # type: ignore[index]
    return json.dumps({**VALID, "runs": [run]}).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"\xff\xfe\x00", "not text"),
        (b"{not json", "not JSON (line 1"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({**VALID, "format_version": 2}).encode(), "newer than this app reads"),
        (json.dumps({**VALID, "format_version": "1"}).encode(), "format_version"),
        (json.dumps({**VALID, "runs": {}}).encode(), "runs: missing or not a list"),
        (json.dumps({**VALID, "title": "x" * 201}).encode(), "title: longer"),
        (with_run(entries=[]), "runs[0].entries: a run starts with the user's message"),
        (with_run(entries=[{"type": "alien"}]), "runs[0].entries[0]: unknown"),
        (with_run(entries=[{"type": "user", "text": 5}]), "runs[0].entries[0].text: expected str"),
        (with_run(parent_run_id="nope"), "runs[0].parent_run_id"),
        (with_run(message_id="other"), "runs[0].message_id"),
        (with_run(selected="1"), "runs[0].selected"),
        (with_run(meta=[1]), "runs[0].meta"),
    ],
)
def test_each_bad_file_is_refused_with_what_is_wrong(data: bytes, message: str):
    with pytest.raises(ChatFileError, match=None) as caught:
        parse(data)
    assert message in str(caught.value)


def test_a_tool_consistent_tree_parses():
    document = json.loads(with_run())
    document["runs"].append(
        {
            "run_id": "b",
            "parent_run_id": None,
            "message_id": "a",  # a regenerate of the same message
            "selected": 2,
            "entries": [
                {"type": "user", "text": "hi"},
                {"type": "tool_call", "call_id": "c", "name": "calculator", "arguments": "{}"},
                {"type": "tool_result", "call_id": "c", "output": "4", "is_error": False},
            ],
            "meta": {"status": "stopped"},
        }
    )
    chat = parse(json.dumps(document).encode())
    assert [r.run_id for r in chat.runs] == ["a", "b"]
    assert chat.runs[1].entries[1:] == [
        ToolCallEntry("c", "calculator", "{}"),
        ToolResultEntry("c", "4", False),
    ]


async def test_bad_files_write_nothing_and_say_why(web_client_factory: MakeClient):
    # A chat file may be larger by a message's worth of attached files (in base64).
    limits = AttachmentLimits(max_mb=0.1)
    client = await web_client_factory(model=ScriptedModel([]), attachment_limits=limits)
    await client.new_chat()
    before = await client.web.chats.recent(EVERY_CHAT)
    for name, data, status, words in [
        ("x.json", b"{broken", 400, "not JSON"),
        ("x.json", b"", 400, "empty"),
        ("x.json", json.dumps({**VALID, "format_version": 9}).encode(), 400, "newer"),
        ("x.json", b" " * (10 * 1024 * 1024 + 10 * limits.max_bytes * 4 // 3 + 1), 413, "larger"),
    ]:
        response = await client.http.post(
            "/chats/import", files={"file": (name, data, "application/json")}
        )
        assert response.status_code == status, name
        alert = parse_html(response.text).find(id="composer-alert").norm_text()
        assert words in alert
    # htmx gets the alert fragment; a post without a file is refused too.
    response = await client.http.post("/chats/import", data={"x": "y"}, headers=HX)
    assert response.status_code == 400
    assert await client.web.chats.recent(EVERY_CHAT) == before


def run_import(source: Path, db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webapp", "import", str(source), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def test_import_from_the_command_line(tmp_path: Path):
    source = tmp_path / "chat.json"
    source.write_text(json.dumps(VALID))
    db = tmp_path / "other.db"
    done = run_import(source, db)
    assert done.returncode == 0, done.stderr
    assert "'t' is chat " in done.stdout
    source.write_text("[]")
    bad = run_import(source, db)
    assert bad.returncode == 2 and "Nothing was imported" in bad.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT title FROM chats").fetchall() == [("t",)]
        assert conn.execute("SELECT COUNT(*) FROM session_segments").fetchone()[0] == 1


# --- issue 22: hostile files ------------------------------------------------------------


def spliced(data: bytes, old: str, new: str) -> bytes:
    """``data`` with its one ``old`` replaced by raw JSON text ``new`` (for values that
    json.dumps would not write: huge integers, NaN, lone surrogates, deep nesting)."""
    text = data.decode()
    assert text.count(old) == 1
    return text.replace(old, new).encode()


DEEP = "[" * 50_000 + "]" * 50_000
HOSTILE_FILES = {
    "nested 50,000 deep": (spliced(with_run(meta={"a": 1}), "1}", DEEP + "}"), "too deeply"),
    "an integer of 4,301 digits": (
        spliced(with_run(selected=7), "7", "9" * 4301),
        "runs[0].selected",
    ),
    "a 400-digit created_at": (
        spliced(json.dumps({**VALID, "created_at": 7}).encode(), "7", "1" * 400),
        "created_at",
    ),
    "created_at NaN": (
        spliced(json.dumps({**VALID, "created_at": 7}).encode(), "7", "NaN"),
        "created_at",
    ),
    "updated_at Infinity": (
        spliced(json.dumps({**VALID, "updated_at": 7}).encode(), "7", "1e400"),
        "updated_at",
    ),
    "updated_at a word": (json.dumps({**VALID, "updated_at": "today"}).encode(), "updated_at"),
    "selected 10**30": (with_run(selected=10**30), "runs[0].selected"),
    "a lone surrogate in the title": (
        spliced(json.dumps({**VALID, "title": "T"}).encode(), '"T"', '"a\\ud800b"'),
        "title",
    ),
    "a lone surrogate in a text": (
        spliced(with_run(), '"yo"', '"\\udfff"'),
        "runs[0].entries[1].text",
    ),
    "a lone surrogate in a meta key": (
        spliced(with_run(meta={"k": 1}), '"k"', '"\\ud800"'),
        "runs[0].meta",
    ),
    "a message over 100,000 characters": (
        with_run(entries=[{"type": "user", "text": "x" * 100_001}]),
        "runs[0].entries[0].text",
    ),
    "Infinity in the meta": (
        spliced(with_run(meta={"usage": 7}), "7", "Infinity"),
        "runs[0].meta.usage",
    ),
    "a meta nested 40 deep": (
        spliced(with_run(meta={"a": 7}), "7", "[" * 40 + "]" * 40),
        "runs[0].meta.a",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE_FILES))
async def test_a_hostile_file_is_refused_naming_the_field_and_writes_nothing(
    web_client_factory: MakeClient, name: str
):
    data, field = HOSTILE_FILES[name]
    client = await web_client_factory(model=ScriptedModel([]))
    kept = await client.new_chat()
    before = await client.web.chats.recent(EVERY_CHAT)
    exported = (await client.http.get(f"/chats/{kept}/export.json")).json()
    response = await client.http.post(
        "/chats/import", files={"file": ("x.json", data, "application/json")}
    )
    assert response.status_code == 400
    alert = parse_html(response.text).find(id="composer-alert").norm_text()
    assert alert.startswith("Not imported: ") and field in alert, alert
    assert await client.web.chats.recent(EVERY_CHAT) == before
    again = (await client.http.get(f"/chats/{kept}/export.json")).json()
    assert normalised(again) == normalised(exported)


async def test_a_file_with_the_largest_selection_stamp_gives_a_usable_chat(
    web_client_factory: MakeClient,
):
    # 2**63 - 1 fits the column, but the next version's stamp (largest + 1) did not: every
    # send, edit, regenerate and switch in the chat was a 500 from then on.
    client = await web_client_factory(model=ScriptedModel(["next", "again", "edited"]))
    imported = await client.http.post(
        "/chats/import",
        files={"file": ("c.json", with_run(selected=2**63 - 1), "application/json")},
    )
    assert imported.status_code == 303
    chat_id = imported.headers["location"].rsplit("/", 1)[1]
    assert (await client.send(chat_id, "go on")).status_code == 303
    await client.wait_idle(chat_id)
    first, second = [s.run_id for s in await client.web.session.segments(chat_id)]
    response = await client.http.post(f"/chats/{chat_id}/regenerate", data={"run_id": second})
    assert response.status_code == 303
    await client.wait_idle(chat_id)
    response = await client.http.post(f"/chats/{chat_id}/switch", data={"run_id": second})
    assert response.status_code == 303
    response = await client.http.post(
        f"/chats/{chat_id}/messages/{first}/edit", data={"text": "hello"}
    )
    assert response.status_code == 303
    await client.wait_idle(chat_id)
    exported = (await client.http.get(f"/chats/{chat_id}/export.json")).json()
    assert sorted(r["selected"] for r in exported["runs"]) == [1, 2, 3, 4]


def test_selection_stamps_are_renumbered_in_their_order():
    document = json.loads(with_run(selected=-5))
    for run_id, selected in (("b", 2**63 - 1), ("c", -5)):
        document["runs"].append({**document["runs"][0], "run_id": run_id, "message_id": "a"})
        document["runs"][-1]["selected"] = selected
    chat = parse(json.dumps(document).encode())
    # Equal stamps: the earlier run ranks higher, as the shown path picks the first.
    assert [(r.run_id, r.selected) for r in chat.runs] == [("a", 2), ("b", 3), ("c", 1)]


async def test_control_characters_are_taken_out_of_an_imported_chat(
    web_client_factory: MakeClient,
):
    document = json.loads(with_run())
    document["title"] = "a\u0000b\u001b[31m"
    document["runs"][0]["entries"] = [
        {"type": "user", "text": "line\r\none\u0000two\u0007"},
        {"type": "assistant", "text": "re\u0000ply\u0008"},
    ]
    document["runs"][0]["meta"] = {"status": "failed", "error": "bad\u0000 thing"}
    client = await web_client_factory(model=ScriptedModel([]))
    imported = await client.http.post(
        "/chats/import",
        files={"file": ("c.json", json.dumps(document).encode(), "application/json")},
    )
    assert imported.status_code == 303
    chat_id = imported.headers["location"].rsplit("/", 1)[1]
    chat = await client.web.chats.get(EVERY_CHAT, chat_id)
    assert chat is not None and chat.title == "ab[31m"
    [segment] = await client.web.session.segments(chat_id)
    assert segment.entries == [UserEntry("line\nonetwo"), AssistantEntry("reply")]
    assert segment.meta == {"status": "failed", "error": "bad thing"}
    page = await client.http.get(f"/chats/{chat_id}")
    assert "\u0000" not in page.text and "\u001b" not in page.text


def test_an_export_never_writes_infinity_or_nan():
    chat = parse(with_run())
    with pytest.raises(ValueError):
        to_json("c", replace(chat, created_at=float("inf")))
    assert "NaN" not in to_json("c", chat) and "Infinity" not in to_json("c", chat)
