"""Hostile markup from the model or from the user is shown as text and never runs."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import Page, expect

from .harness import AppFactory, FakeEndpoint
from .ui import REPLY, USER, open_new_chat, send, users, wait_status

HOSTILE_USER_TEXT = (
    "look <script>window.__pwned=1</script> "
    '<img src=x onerror="window.__pwned=1"> '
    "[click](javascript:window.__pwned=1) <b>raw bold</b>"
)

# Everything on the page that could have executed or injected markup.
_INJECTED_JS = """
() => ({
  pwned: typeof window.__pwned !== 'undefined',
  inlineScripts: Array.from(document.scripts).filter(s => !s.src).map(s => s.outerHTML),
  messageScripts: document.querySelectorAll('[data-role] script').length,
  onerror: Array.from(document.querySelectorAll('[onerror]')).map(e => e.outerHTML),
  messageImages: document.querySelectorAll('[data-role] img').length,
  messageBold: document.querySelectorAll('[data-role] b').length,
  jsLinks: Array.from(document.querySelectorAll('a[href]'))
    .filter(a => a.href.trim().toLowerCase().startsWith('javascript:')).map(a => a.outerHTML),
})
"""


def _assert_inert(page: Page, where: str) -> None:
    found = page.evaluate(_INJECTED_JS)
    assert found == {
        "pwned": False,
        "inlineScripts": [],
        "messageScripts": 0,
        "onerror": [],
        "messageImages": 0,
        "messageBold": 0,
        "jsLinks": [],
    }, f"hostile markup became live in {where}: {found}"
    # The markup is visible as the text it is.
    element = page.locator(where).last
    expect(element).to_contain_text("<script>window.__pwned=1</script>")
    expect(element).to_contain_text("<b>raw bold</b>")


def test_hostile_model_output_is_inert(
    fake_endpoint: Callable[[str], FakeEndpoint],
    start_app: AppFactory,
    open_page: Callable[..., Page],
) -> None:
    endpoint = fake_endpoint("hostile")
    server = start_app("--base-url", endpoint.base_url, "--model", "test")
    page = open_page(server)
    open_new_chat(page)
    send(page, "say something nasty")
    wait_status(page, "completed")
    assert endpoint.requests, "the app never called the configured endpoint"
    _assert_inert(page, REPLY)
    page.reload()
    wait_status(page, "completed")
    _assert_inert(page, REPLY)


def test_hostile_user_text_is_inert(page: Page) -> None:
    open_new_chat(page)
    send(page, HOSTILE_USER_TEXT)
    expect(users(page)).to_have_count(1)
    wait_status(page, "completed")
    _assert_inert(page, USER)
    page.reload()
    wait_status(page, "completed")
    _assert_inert(page, USER)
