"""SPEC §18 for screen readers: who speaks, what is announced and when.

- The conversation is a polite log; a reply is `aria-busy` while it streams and reaches the
  log once, complete (never chunk by chunk, and redrawing the conversation is not news).
- Every message is named by who wrote it: "You", or the model's name ("Assistant" when
  the model is not known).
- Search as you type says how many chats match through one status that stays in the page.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect

from .harness import AppServer
from .ui import (
    TOOL,
    button,
    download_export,
    last_reply,
    message_box,
    open_new_chat,
    replies,
    reply_states,
    search_box,
    send_and_wait,
    users,
    wait_for_numbers,
    wait_status,
)

# What a screen reader would hear from the log: every node added to it (or text changed
# in it) while it is polite and not inside an aria-busy element.
_LISTEN = """
() => {
  const region = document.getElementById('messages');
  window.__heard = [];
  new MutationObserver(records => {
    for (const record of records) {
      if (region.getAttribute('aria-live') !== 'polite') continue;
      const at = record.target.nodeType === 1 ? record.target : record.target.parentElement;
      if (at.closest('[aria-busy=true]')) continue;
      if (record.type === 'characterData') {
        window.__heard.push({text: record.target.textContent});
      }
      for (const node of record.addedNodes) {
        if (node.nodeType === 1) {
          window.__heard.push({role: node.getAttribute('data-role'),
                               status: node.getAttribute('data-status'),
                               runId: node.getAttribute('data-run-id')});
        } else if (node.textContent.trim()) {
          window.__heard.push({text: node.textContent});
        }
      }
    }
  }).observe(region, {subtree: true, childList: true, characterData: true});
}
"""


def test_a_reply_streams_busy_and_is_announced_once_when_complete(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, "count to 3")
    log = page.locator("#messages")
    expect(log).to_have_attribute("role", "log")
    expect(log).to_have_attribute("aria-live", "polite")
    expect(page.get_by_role("log", name="Conversation")).to_have_count(1)
    page.evaluate(_LISTEN)

    message_box(page).focus()
    page.keyboard.type("count to 150")
    page.keyboard.press("Enter")
    expect(replies(page)).to_have_count(2)
    wait_for_numbers(page, 10)
    streaming = last_reply(page)
    expect(streaming).to_have_attribute("data-status", "streaming")
    expect(streaming).to_have_attribute("aria-busy", "true")
    expect(log.locator("[data-role=assistant][aria-busy=true]")).to_have_count(1)
    expect(log).to_have_attribute("aria-live", "polite")  # polite again after the send

    done = wait_status(page, "completed")
    expect(done).not_to_have_attribute("aria-busy", "true")
    run_id = reply_states(page)[-1].run_id
    heard: list[dict[str, Any]] = page.evaluate("() => window.__heard")
    assert heard == [{"role": "assistant", "status": "completed", "runId": run_id}], (
        f"the log should have announced the finished reply once, and nothing else: {heard[:10]}"
    )


def test_messages_are_named_by_who_wrote_them(
    app: AppServer, open_page: Callable[..., Page], tmp_path: Path
) -> None:
    page = open_page(app)
    open_new_chat(page)
    send_and_wait(page, "count to 2")
    send_and_wait(page, "what is 12*(3+4)?")
    expect(page.get_by_role("article", name="You", exact=True)).to_have_count(2)
    # A tool's result inside a reply is named after the tool that wrote it.
    card = last_reply(page).locator(TOOL)
    expect(card).to_have_count(1)
    expect(card).to_have_accessible_name("Tool calculator")
    expect(users(page).first).to_have_accessible_name("You")
    model = last_reply(page).get_attribute("data-model")
    assert model, "a reply of the offline model records its model"
    expect(page.get_by_role("article", name=model, exact=True)).to_have_count(2)
    for reply in replies(page).all():
        expect(reply).to_have_accessible_name(model)
    # Who speaks is also a heading of each message, to move from one to the next.
    expect(page.get_by_role("heading", name="You", exact=True)).to_have_count(2)
    # The message being edited is still the person's.
    button(users(page).first, "Edit").click()
    expect(page.get_by_label("Edit message", exact=True)).to_be_visible()
    expect(users(page).first).to_have_accessible_name("You")

    # A reply whose model is not known (an imported chat from before models were
    # recorded): "Assistant".
    page.reload()
    name, data = download_export(page, "JSON")
    document = json.loads(data)
    for run in document["runs"]:
        run["model"] = None
    file = tmp_path / name
    file.write_text(json.dumps(document))
    page.get_by_text("More", exact=True).click()
    page.get_by_label("Chat file", exact=True).set_input_files(file)
    with page.expect_navigation():
        button(page, "Import").click()
    expect(replies(page)).to_have_count(2)
    for reply in replies(page).all():
        expect(reply).to_have_accessible_name("Assistant")
    expect(page.get_by_role("article", name="You", exact=True)).to_have_count(2)


def test_the_search_status_stays_and_says_how_many_chats_match(page: Page) -> None:
    for text in ("about the quokka, first", "about the quokka, second"):
        open_new_chat(page)
        send_and_wait(page, text)
    status = page.locator("#search-status")
    expect(status).to_have_attribute("role", "status")
    expect(status).to_have_text("")
    status.evaluate("el => { el.dataset.kept = 'yes'; }")  # a new element would not have it

    page.keyboard.press("Control+K")
    expect(search_box(page)).to_be_focused()
    page.keyboard.type("quokka")
    expect(status).to_have_text("2 chats match")
    expect(page.get_by_role("list", name="Search results").get_by_role("link")).to_have_count(2)
    page.keyboard.type(" first")
    expect(status).to_have_text("1 chat matches")
    page.keyboard.type(" wombat")
    expect(status).to_have_text("No chat matches")
    expect(page.locator("#search-results")).to_contain_text(
        "No chat matches “quokka first wombat”."
    )
    expect(page.locator("#search-status[data-kept=yes]")).to_have_count(1)
    expect(page.locator("[role=status]#search-status")).to_have_count(1)
    page.keyboard.press("Control+A")
    page.keyboard.press("Backspace")
    expect(status).to_have_text("")
    expect(page.locator("#search-status[data-kept=yes]")).to_have_count(1)
