"""Long chats open at their latest messages; older ones load a page at a time (issue 11)."""

from __future__ import annotations

from pathlib import Path

from webhelpers import HX, MakeClient, messages, parse_html, write_long_chat

from webapp.models import ScriptedModel
from webapp.web.chat_service import PAGE_RUNS

RUNS = 60


def texts(page) -> list[str]:
    return [m.find(class_="content").norm_text() for m in messages(page)]


def earlier_link(page) -> str | None:
    links = [a for a in page.find_all("a") if a.norm_text() == "Load earlier messages"]
    return links[0].attrs["href"] if links else None


async def test_a_long_chat_opens_at_its_latest_page_and_scrolls_back(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    chat_id = await write_long_chat(db, "long", RUNS)
    client = await web_client_factory(db=db, model=ScriptedModel([]))
    page = await client.page(chat_id)
    first = RUNS - PAGE_RUNS
    assert texts(page) == [t for n in range(first, RUNS) for t in (f"question {n}", f"answer {n}")]
    seen = texts(page)
    href = earlier_link(page)
    assert href == f"/chats/{chat_id}?before=run{first:03d}"
    while href is not None:  # what htmx does as the user scrolls up
        response = await client.http.get(href, headers=HX)
        assert response.status_code == 200
        fragment = parse_html(response.text)
        assert fragment.find_all("form", id="composer") == []  # just the messages
        seen = texts(fragment) + seen
        href = earlier_link(fragment)
    # Every message once, in order.
    assert seen == [t for n in range(RUNS) for t in (f"question {n}", f"answer {n}")]
    # Without JavaScript the link opens a page of the older messages.
    plain = parse_html((await client.http.get(f"/chats/{chat_id}?before=run{first:03d}")).text)
    assert texts(plain)[0] == f"question {first - PAGE_RUNS}"
    assert texts(plain)[-1] == f"answer {first - 1}"
    assert [a for a in plain.find_all("a") if a.norm_text() == "Show the latest messages"]
    assert plain.find("form", id="composer") is not None
    missing = await client.http.get(f"/chats/{chat_id}?before=nope")
    assert missing.status_code == 404


async def test_a_message_on_an_older_page_can_be_edited(
    web_client_factory: MakeClient, tmp_path: Path
):
    db = tmp_path / "chat.db"
    chat_id = await write_long_chat(db, "long", RUNS)
    client = await web_client_factory(db=db, model=ScriptedModel(["new answer"]))
    form = await client.http.get(f"/chats/{chat_id}/messages/run003/edit", headers=HX)
    assert form.status_code == 200
    assert parse_html(form.text).find("textarea").text() == "question 3"
    edited = await client.http.post(
        f"/chats/{chat_id}/messages/run003/edit", data={"text": "question three"}
    )
    assert edited.status_code == 303
    await client.wait_idle(chat_id)
    assert texts(await client.page(chat_id))[-2:] == ["question three", "new answer"]
