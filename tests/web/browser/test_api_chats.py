"""A conversation a program stored through the API (``"store": true``, SPEC §16) is a
chat in the browser: listed and marked API, opened, and continued there."""

from __future__ import annotations

from collections.abc import Callable

import openai
from playwright.sync_api import Page, expect

from .conftest import AppFactory
from .harness import AppServer
from .ui import chat_links, normalized, replies, reply_states, send_and_wait, users


def test_a_stored_api_conversation_is_a_chat_marked_api_to_go_on_with(
    start_app: AppFactory, open_page: Callable[[AppServer], Page]
):
    server = start_app()
    api = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    model = api.models.list().data[0].id
    api.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "count to 3"}],
        extra_body={"store": True},
    )
    api.chat.completions.create(model=model, messages=[{"role": "user", "content": "count to 4"}])
    page = open_page(server)
    page.goto("/")
    assert [name for name, _ in chat_links(page)] == ["count to 3 API"]
    badge = page.get_by_role("navigation", name="Chats", exact=True).get_by_text("API")
    expect(badge).to_be_visible()
    page.get_by_role("link", name="count to 3 API").click()
    expect(users(page)).to_have_count(1)
    expect(replies(page)).to_have_count(1)
    assert reply_states(page)[0].status == "completed"
    assert normalized(reply_states(page)[0].text) == "1 2 3"
    reply = send_and_wait(page, "count to 2")
    assert normalized(reply.text) == "1 2"
    expect(users(page)).to_have_count(2)
