"""Hostile or malformed input through the real routes: never a 500, never stored as garbage."""

from __future__ import annotations

import pytest
from webhelpers import MakeClient, WebClient, parse_html, parse_sse, textarea_value

from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel
from webapp.transcript import UserEntry
from webapp.web.sse import parse_position

BOUNDARY = "test-boundary-7MA4YWxkTrZu0gW"


def multipart(fields: dict[bytes, bytes]) -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body of raw field names and values, as a browser posts it."""
    body = b""
    for name, value in fields.items():
        body += b"--%s\r\n" % BOUNDARY.encode()
        body += b'Content-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % (name, value)
    body += b"--%s--\r\n" % BOUNDARY.encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


async def user_texts(client: WebClient, chat_id: str) -> list[str]:
    segments = await client.web.session.segments(chat_id)
    return [e.text for s in segments for e in s.entries if isinstance(e, UserEntry)]


# --- SSE positions ----------------------------------------------------------------------


def test_unicode_digits_in_a_position_are_stale_not_a_crash():
    for bad in ("x:\u00b3", "x:\u2460", "x:1\u00b2", "x:\u0663", "x:\uff11"):
        assert parse_position(bad) == (None, 0), bad


@pytest.mark.parametrize(
    "where",
    [
        {"params": {"after": "x:\u00b3"}},
        {"params": {"after": "x:\u2460"}},
        {"headers": {"Last-Event-ID": b"x:\xb3"}},  # raw latin-1 byte: "³" once decoded
    ],
)
async def test_unicode_digits_in_an_sse_position_get_a_reset(
    web_client_factory: MakeClient, where: dict[str, object]
):
    client = await web_client_factory(model=ScriptedModel(["hello there"]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "hi")
    await client.wait_idle(chat_id)
    state = client.web.runs.latest(chat_id)
    assert state is not None
    response = await client.http.get(
        f"/chats/{chat_id}/runs/{state.run_id}/events",
        **where,  # type: ignore[arg-type]
    )
    assert response.status_code == 200
    (reset,) = parse_sse(response.text)
    assert reset.event == "reset"
    assert "hello there" in parse_html(reset.data).text()


# --- form encodings ---------------------------------------------------------------------


async def test_invalid_utf8_in_a_multipart_field_is_400_like_urlencoded(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(model=ScriptedModel([]))
    chat_id = await client.new_chat()
    url = f"/chats/{chat_id}/messages"
    body, headers = multipart({b"text": b"caf\xe9 au lait"})
    as_multipart = await client.http.post(url, content=body, headers=headers)
    as_urlencoded = await client.http.post(
        url,
        content=b"text=caf%E9+au+lait",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    for response in (as_multipart, as_urlencoded):
        assert response.status_code == 400
        alert = parse_html(response.text).find(role="alert").norm_text()
        assert alert.startswith("The form could not be read"), alert
    assert await user_texts(client, chat_id) == []
    # A field name that is not UTF-8 is refused the same way.
    body, headers = multipart({b"te\xffxt": b"hello"})
    response = await client.http.post(url, content=body, headers=headers)
    assert response.status_code == 400
    assert await user_texts(client, chat_id) == []


async def test_valid_utf8_multipart_is_stored_exactly(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["ok"]))
    chat_id = await client.new_chat()
    text = "caf\u00e9 \u2615 \U0001f600 \u00fc"
    body, headers = multipart({b"text": text.encode("utf-8"), b"client_id": b"abc-1"})
    response = await client.http.post(f"/chats/{chat_id}/messages", content=body, headers=headers)
    assert response.status_code == 303, response.text
    await client.wait_idle(chat_id)
    assert await user_texts(client, chat_id) == [text]


# --- blank and control characters -------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "\u200b",
        "\u2060\ufeff",
        " \u200b\n\u200c\u200d\t\r\n",
        "\u00ad\u180e\u2061",
        "\x00",
        "\x00\u200b\x07",
        "\u3164\u034f\ufe0f",
    ],
)
async def test_a_message_of_only_invisible_characters_is_empty(
    web_client_factory: MakeClient, text: str
):
    client = await web_client_factory(model=ScriptedModel([]))
    chat_id = await client.new_chat()
    response = await client.send(chat_id, text)
    assert response.status_code == 400
    page = parse_html(response.text)
    assert "empty" in page.find(role="alert").norm_text()
    kept = textarea_value(page, "Message")
    assert kept.strip("\n") == text.replace("\r\n", "\n").replace("\x00", "").replace(
        "\x07", ""
    ).strip("\n")  # the draft comes back (HTML drops one leading newline)
    assert await user_texts(client, chat_id) == []
    assert await client.active_run(chat_id) is None


async def test_an_invisible_first_message_does_not_create_a_chat(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(model=ScriptedModel([]))
    response = await client.http.post("/chats", data={"text": "\u200b\u2060"})
    assert response.status_code == 400
    assert await client.web.chats.recent(EVERY_CHAT) == []


async def test_control_characters_are_removed_from_messages(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["ok"]))
    chat_id = await client.new_chat()
    response = await client.send(chat_id, "nul\x00 bell\x07 esc\x1b[31m tab\tend\x7f\r\nline2")
    assert response.status_code == 303, response.text
    await client.wait_idle(chat_id)
    expected = "nul bell esc[31m tab\tend\nline2"
    assert await user_texts(client, chat_id) == [expected]
    html = (await client.http.get(f"/chats/{chat_id}")).text
    for char in ("\x00", "\x07", "\x1b", "\x7f"):
        assert char not in html, repr(char)
    page = parse_html(html)
    assert page.find(data_role="user").find(class_="content").text() == expected
    chat = await client.web.chats.get(EVERY_CHAT, chat_id)
    assert chat is not None and "\x00" not in chat.title


async def test_control_characters_are_removed_from_titles(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["ok"]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "first message")
    await client.wait_idle(chat_id)
    response = await client.http.post(
        f"/chats/{chat_id}/rename", data={"title": "\x00My\x01 title\x1f"}
    )
    assert response.status_code == 303, response.text
    chat = await client.web.chats.get(EVERY_CHAT, chat_id)
    assert chat is not None and chat.title == "My title"
    # A title of nothing visible restores the automatic one, like an empty title.
    await client.http.post(f"/chats/{chat_id}/rename", data={"title": "\u200b\x00"})
    chat = await client.web.chats.get(EVERY_CHAT, chat_id)
    assert chat is not None and chat.title == "first message"
