"""What a user sees and does in the chat page, written against SPEC §6's UI contract.

Locators use accessible names (exact, because "Save and send" contains "send" and
"Edit message" contains "message") and the data-role / data-run-id / data-status
attributes; nothing here depends on the app's markup beyond that contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from playwright.sync_api import Locator, Page, expect

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]
REPLY = "[data-role=assistant]"
USER = "[data-role=user]"
TOOL = "[data-role=tool]"

# One atomic read of every reply: status, run id and the text of its own .content
# elements (not those of a tool card nested in it). textContent, not innerText, so
# that sampling a long stream many times never forces a layout.
_REPLIES_JS = """
() => Array.from(document.querySelectorAll('[data-role=assistant]')).map(reply => {
  const parts = Array.from(reply.querySelectorAll('.content'))
    .filter(c => c.closest('[data-role]') === reply);
  return {
    runId: reply.getAttribute('data-run-id'),
    status: reply.getAttribute('data-status'),
    text: parts.length ? parts.map(c => c.textContent).join('\\n') : null,
  };
})
"""

# Installed before any page script runs (context.add_init_script): records every DOM
# state the replies pass through, so a state that lasts a few milliseconds (a reply
# "streaming" a 30-number count) is still observed, and checks on every change that a
# counting reply is a contiguous prefix 1..k (a duplicate or gap shows up here even if
# the final swap later hides it).
RECORDER_JS = """
(() => {
  const log = []; const violations = [];
  window.__pwStates = log; window.__pwViolations = violations;
  const take = () => {
    const replies = Array.from(document.querySelectorAll('[data-role=assistant]'));
    const users = document.querySelectorAll('[data-role=user]').length;
    const states = replies.map(reply => {
      const parts = Array.from(reply.querySelectorAll('.content'))
        .filter(c => c.closest('[data-role]') === reply);
      const text = parts.map(c => c.textContent).join('\\n');
      const nums = (text.match(/\\d+/g) || []).map(Number);
      const bad = nums.findIndex((n, i) => n !== i + 1);
      if (nums.length > 2 && bad !== -1 && violations.length < 50) {
        violations.push({status: reply.getAttribute('data-status'), at: bad,
                         around: nums.slice(Math.max(0, bad - 3), bad + 3)});
      }
      return {runId: reply.getAttribute('data-run-id'),
              status: reply.getAttribute('data-status'),
              length: text.length, last: nums.length ? nums[nums.length - 1] : null,
              head: text.slice(0, 120)};
    });
    const key = JSON.stringify([users, states]);
    if (log.length === 0 || log[log.length - 1].key !== key) {
      if (log.length < 20000) log.push({key, users, replies: states, t: performance.now()});
    }
  };
  const start = () => {
    take();
    new MutationObserver(take).observe(document.documentElement,
      {subtree: true, childList: true, characterData: true, attributes: true});
  };
  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', start);
  } else { start(); }
})();
"""


@dataclass(frozen=True)
class ReplyState:
    run_id: str | None
    status: str | None
    text: str | None


def message_box(page: Page) -> Locator:
    return page.get_by_label("Message", exact=True)


def button(scope: Page | Locator, name: str) -> Locator:
    return scope.get_by_role("button", name=name, exact=True)


def replies(page: Page) -> Locator:
    return page.locator(REPLY)


def users(page: Page) -> Locator:
    return page.locator(USER)


def last_reply(page: Page) -> Locator:
    return page.locator(REPLY).last


def regenerate_button(reply: Locator) -> Locator:
    """The Regenerate button of one reply element (every finished reply has its own)."""
    return button(reply, "Regenerate")


def versions(scope: Locator) -> Locator:
    """The version switcher inside one message or reply element."""
    return scope.get_by_role("group", name="Versions", exact=True)


def expect_version(scope: Locator, index: int, count: int) -> None:
    """The switcher says `index / count`; Previous and Next are disabled exactly at the ends."""
    switcher = versions(scope)
    expect(switcher).to_have_count(1)
    expect(switcher).to_have_text(re.compile(rf"^\D*\b{index} / {count}\b\D*$"))
    previous, following = button(switcher, "Previous version"), button(switcher, "Next version")
    for control, at_end in ((previous, index == 1), (following, index == count)):
        if at_end:
            expect(control).to_be_disabled()
        else:
            expect(control).to_be_enabled()


def switch_version(scope: Locator, name: str, to_index: int, count: int) -> None:
    """Press Previous version / Next version in `scope` and wait until it shows `to_index`."""
    button(versions(scope), name).click()
    expect_version(scope, to_index, count)


def open_new_chat(page: Page) -> str:
    """Home page, click New chat, land on an empty chat; returns its URL."""
    page.goto("/")
    button(page, "New chat").click()
    expect(page).to_have_url(re.compile(r"/chats/[^/]+$"))
    expect(message_box(page)).to_be_visible()
    expect(users(page)).to_have_count(0)
    return page.url


def send(page: Page, text: str) -> None:
    message_box(page).fill(text)
    button(page, "Send").click()


def reply_states(page: Page) -> list[ReplyState]:
    raw: list[dict[str, Any]] = page.evaluate(_REPLIES_JS)
    return [ReplyState(r["runId"], r["status"], r["text"]) for r in raw]


def wait_status(page: Page, status: str, timeout: float = 15_000, index: int = -1) -> Locator:
    reply = replies(page).nth(index) if index >= 0 else last_reply(page)
    expect(reply).to_have_attribute("data-status", status, timeout=timeout)
    return reply


def send_and_wait(page: Page, text: str, timeout: float = 15_000) -> ReplyState:
    """Send, then wait until the new reply has completed; returns it."""
    before = users(page).count()
    send(page, text)
    expect(users(page)).to_have_count(before + 1)
    expect(replies(page)).to_have_count(before + 1)
    wait_status(page, "completed", timeout)
    return reply_states(page)[-1]


def numbers(text: str | None) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text or "")]


def counted(n: int) -> str:
    return " ".join(str(i) for i in range(1, n + 1))


def normalized(text: str | None) -> str:
    return " ".join((text or "").split())


def assert_contiguous_prefix(nums: list[int], what: str) -> None:
    """1, 2, ..., k with no gap and no repeat."""
    for i, n in enumerate(nums):
        if n != i + 1:
            raise AssertionError(
                f"{what}: not a contiguous prefix 1..k: at position {i} expected {i + 1}, "
                f"found {n} (neighbours {nums[max(0, i - 3) : i + 3]}, {len(nums)} numbers)"
            )


def wait_for_numbers(page: Page, at_least: int, timeout_s: float = 15.0) -> int:
    """Wait until the last reply shows at least `at_least` numbers; returns how many."""
    page.wait_for_function(
        """n => { const r = Array.from(document.querySelectorAll('[data-role=assistant]')).pop();
                  if (!r) return false;
                  const t = Array.from(r.querySelectorAll('.content'))
                    .filter(c => c.closest('[data-role]') === r)
                    .map(c => c.textContent).join(' ');
                  return (t.match(/\\d+/g) || []).length >= n; }""",
        arg=at_least,
        timeout=timeout_s * 1000,
    )
    return len(numbers(reply_states(page)[-1].text))


def recorded_states(page: Page) -> list[dict[str, Any]]:
    states: list[dict[str, Any]] = page.evaluate("() => window.__pwStates || []")
    return states


def recorded_violations(page: Page) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = page.evaluate("() => window.__pwViolations || []")
    return found


# --- The sidebar's library: the chat list, import, search; export in Chat options ----


def chat_links(page: Page) -> list[tuple[str, str]]:
    """(name, href) of every link in the "Chats" list, top to bottom."""
    links = page.get_by_role("navigation", name="Chats", exact=True).get_by_role("link")
    return [(link.inner_text().strip(), link.get_attribute("href") or "") for link in links.all()]


def open_chat_options(page: Page) -> Locator:
    """Open the chat header's Chat options (a <details>, so no script needed); returns it."""
    summary = page.get_by_text("Chat options", exact=True)
    menu = page.locator("details").filter(has=summary)
    if menu.get_attribute("open") is None:
        summary.click()
    expect(menu).to_have_attribute("open", "")
    return menu


def download_export(page: Page, name: str) -> tuple[str, bytes]:
    """Click the export link `name` (Markdown or JSON) in Chat options: (file name, bytes)."""
    menu = open_chat_options(page)
    with page.expect_download() as info:
        menu.get_by_role("link", name=name, exact=True).click()
    download = info.value
    with open(download.path(), "rb") as file:
        return download.suggested_filename, file.read()


def search_box(page: Page) -> Locator:
    return page.get_by_label("Search chats", exact=True)


def search_results(page: Page) -> Locator:
    return page.get_by_role("list", name="Search results", exact=True)


# --- Keyboard (SPEC §18) -------------------------------------------------------------


def expect_skip_link_lands(page: Page, path: str, target: str) -> None:
    """On `path`, Enter on the skip link focuses #`target` (the page's first Tab stop,
    unless a field has autofocus, as on the sign-in page)."""
    page.goto(path)
    link = page.locator("a.skip-link")
    if page.evaluate("() => document.activeElement === document.body"):
        page.keyboard.press("Tab")
    else:
        link.focus()
    expect(link).to_be_focused()
    href = link.get_attribute("href") or ""
    assert href == f"#{target}", f"{path}: the skip link points to {href!r}"
    expect(page.locator(f"#{target}")).to_have_count(1)
    page.keyboard.press("Enter")
    expect(page.locator(f"#{target}")).to_be_focused()
