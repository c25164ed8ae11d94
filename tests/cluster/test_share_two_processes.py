"""SPEC §15 on PostgreSQL with two processes, in a real Chromium: a link made on A opens
on B; Update on B shows the later message on A's copy; Revoke on A is 404 on B at once."""

from __future__ import annotations

import re
from collections.abc import Callable

from playwright.sync_api import Page, expect

from .machinery import Pair, ui


def _link(page: Page) -> str:
    box = page.get_by_label("Share link", exact=True)
    expect(box).to_have_attribute("readonly", "")
    value = box.input_value()
    found = re.search(r"(/s/[A-Za-z0-9_-]{43})$", value)
    assert found, value
    return found.group(1)


def test_a_link_made_on_a_is_updated_and_revoked_for_b_at_once(
    pair: Pair, open_page: Callable[[str], Page]
) -> None:
    a, b = pair
    owner = open_page(a.base_url)
    chat = ui.open_new_chat(owner)
    ui.send_and_wait(owner, "count to 3")
    owner.get_by_role("link", name="Share", exact=True).click()
    ui.button(owner, "Create link").click()
    path = _link(owner)

    viewer = open_page(b.base_url)
    viewer.goto(path)
    expect(viewer.locator("[data-role=user]")).to_have_count(1)
    expect(ui.message_box(viewer)).to_have_count(0)

    owner.goto(chat)
    ui.send_and_wait(owner, "count to 4")
    viewer.reload()
    expect(viewer.locator("[data-role=user]")).to_have_count(1)  # a snapshot

    # Update from the other process: the same link now shows both messages.
    manage = open_page(b.base_url)
    manage.goto(chat + "/share")
    ui.button(manage, "Update link").click()
    assert _link(manage) == path
    viewer.reload()
    expect(viewer.locator("[data-role=user]")).to_have_count(2)

    owner.goto(chat + "/share")
    ui.button(owner, "Revoke link").click()
    expect(ui.button(owner, "Create link")).to_be_visible()
    response = viewer.goto(path)
    assert response is not None and response.status == 404
    expect(viewer.locator("[data-role=user]")).to_have_count(0)
