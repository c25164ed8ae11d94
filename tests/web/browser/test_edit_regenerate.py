"""Edit and resend rewinds the chat to the edited message; Regenerate reruns a reply.

What either replaces is kept as a version (SPEC §7); test_versions.py switches back to it.
"""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from .ui import (
    button,
    expect_version,
    message_box,
    open_new_chat,
    regenerate_button,
    replies,
    reply_states,
    send,
    send_and_wait,
    users,
    versions,
    wait_for_numbers,
    wait_status,
)

FIRST, SECOND, THIRD = "first question alpha", "second question bravo", "third question charlie"
EDITED = "edited question delta"


def _three_exchanges(page: Page) -> list[str | None]:
    open_new_chat(page)
    return [send_and_wait(page, text).run_id for text in (FIRST, SECOND, THIRD)]


def _assert_transcript(page: Page, texts: list[str], run_ids: list[str | None]) -> None:
    expect(users(page)).to_have_count(len(texts))
    for i, text in enumerate(texts):
        expect(users(page).nth(i)).to_contain_text(text)
    assert [r.run_id for r in reply_states(page)] == run_ids


def test_cancel_edit_leaves_everything_as_it_was(page: Page) -> None:
    run_ids = _three_exchanges(page)
    users(page).nth(1).get_by_role("button", name="Edit", exact=True).click()
    box = page.get_by_label("Edit message", exact=True)
    expect(box).to_be_visible()
    expect(box).to_have_value(SECOND)
    box.fill("this edit is abandoned")
    button(page, "Cancel").click()
    expect(page.get_by_label("Edit message", exact=True)).to_have_count(0)
    _assert_transcript(page, [FIRST, SECOND, THIRD], run_ids)
    page.reload()
    _assert_transcript(page, [FIRST, SECOND, THIRD], run_ids)


def test_edit_first_message_hides_later_turns_in_a_version_and_survives_reload(
    page: Page,
) -> None:
    old_run_ids = _three_exchanges(page)
    users(page).first.get_by_role("button", name="Edit", exact=True).click()
    box = page.get_by_label("Edit message", exact=True)
    expect(box).to_have_value(FIRST)
    box.fill(EDITED)
    button(page, "Save and send").click()

    expect(users(page)).to_have_count(1)
    expect(users(page).first).to_contain_text(EDITED)
    expect(replies(page)).to_have_count(1)
    wait_status(page, "completed")
    reply = reply_states(page)[0]
    assert reply.run_id not in old_run_ids, "the edited message's reply reuses an old run id"
    # The offline model quotes the message it answers: proof it answered the edit.
    assert EDITED in (reply.text or ""), f"the reply does not answer the edit: {reply.text!r}"
    # The original message and its turns are not thrown away: they are version 1 of 2.
    expect_version(users(page).first, 2, 2)
    expect(versions(replies(page).first)).to_have_count(0)

    page.reload()
    expect(users(page)).to_have_count(1)
    expect(users(page).first).to_contain_text(EDITED)
    expect(page.locator("[data-role]").filter(has_text=FIRST)).to_have_count(0)
    expect(replies(page)).to_have_count(1)
    assert reply_states(page)[0] == reply
    expect_version(users(page).first, 2, 2)


def test_regenerate_shows_a_new_version_of_the_last_reply(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, "count to 3")
    first = send_and_wait(page, "tell me about durable runs")
    expect(versions(replies(page).last)).to_have_count(0)
    regenerate_button(replies(page).last).click()
    # The new run shows up as a reply with another run id, still the only reply to it.
    expect(replies(page).last).not_to_have_attribute("data-run-id", first.run_id or "")
    wait_status(page, "completed")
    expect(users(page)).to_have_count(2)
    expect(replies(page)).to_have_count(2)
    again = reply_states(page)[-1]
    assert again.run_id != first.run_id
    assert "durable runs" in (again.text or ""), f"regenerated reply: {again.text!r}"
    print(f"regenerate changed the wording: {again.text != first.text}")
    expect_version(replies(page).last, 2, 2)
    expect(versions(replies(page).first)).to_have_count(0)

    page.reload()
    expect(users(page)).to_have_count(2)
    expect(replies(page)).to_have_count(2)
    assert reply_states(page)[-1] == again
    expect_version(replies(page).last, 2, 2)
    # Every reply offers its own Regenerate, not only the last one.
    expect(button(page, "Regenerate")).to_have_count(2)
    for i in range(2):
        expect(regenerate_button(replies(page).nth(i))).to_have_count(1)


def test_edit_during_a_run_is_refused_and_keeps_the_edit(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, FIRST)
    send(page, "count to 2000")
    wait_for_numbers(page, 10)
    users(page).first.get_by_role("button", name="Edit", exact=True).click()
    box = page.get_by_label("Edit message", exact=True)
    box.fill(EDITED)
    button(page, "Save and send").click()
    busy = page.get_by_role("alert").filter(has_text=re.compile(r"running|409", re.IGNORECASE))
    expect(busy).to_be_visible()
    expect(page.get_by_label("Edit message", exact=True)).to_have_value(EDITED)
    # Nothing was rewound: the run goes on and both exchanges are still there.
    expect(users(page)).to_have_count(2)
    expect(users(page).first).to_contain_text(FIRST)
    expect(button(page, "Stop")).to_be_visible()
    button(page, "Stop").click()
    wait_status(page, "stopped")
    expect(message_box(page)).to_be_visible()
