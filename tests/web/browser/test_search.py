"""Search chats (SPEC §8): live results as you type, the plain GET form, Ctrl+K.

The module's app answers from the "numbered" fake endpoint, so every reply carries a
number no message has ("This is fake reply #7."): the messages here have no digits,
and a number found can only have come from a reply -- or from an older version of one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import urlsplit

from playwright.sync_api import Dialog, Locator, Page, expect

from .harness import EndpointApp, numbered_reply
from .ui import (
    button,
    message_box,
    open_chat_options,
    open_new_chat,
    regenerate_button,
    replies,
    search_box,
    search_results,
    send_and_wait,
    wait_status,
)

MAX_QUERY_CHARS = 1_000  # the app searches (and echoes) only the start of a longer query
HOSTILE_MARKUP = "<img src=x onerror=alert(1)>"
HOSTILE_QUERIES = [
    '"',
    "AND (",
    "*",
    HOSTILE_MARKUP,
    ('"NEAR(x* AND <b>y</b>) OR -z ^ü: ' * 200)[:5_000],
]


def _reply_number(app: EndpointApp, page: Page, message: str) -> str:
    """Send `message` and wait for its reply; returns the number only that reply has."""
    n = len(app.endpoint.requests) + 1
    send_and_wait(page, message)
    expect(replies(page).last).to_contain_text(numbered_reply(n))
    return str(n)


def _live_search(page: Page, text: str) -> Locator:
    """Fill the search box (no Enter) and return the results area once htmx replaced it."""
    # The answer replaces the whole area (outerHTML): an element without this mark is new.
    page.locator("#search-results").evaluate("area => { area.dataset.stale = 'yes'; }")
    with page.expect_response(lambda r: urlsplit(r.url).path == "/search") as answered:
        search_box(page).fill(text)
    assert answered.value.status == 200, f"{text[:40]!r}: HTTP {answered.value.status}"
    fresh = page.locator("#search-results:not([data-stale])")
    expect(fresh).to_have_count(1)
    return fresh


def _hits(page: Page) -> list[str]:
    """The paths the search results link to, top to bottom."""
    links = search_results(page).get_by_role("link")
    expect(links.first).to_be_visible()
    return [link.get_attribute("href") or "" for link in links.all()]


def _path(url: str) -> str:
    return urlsplit(url).path


def _expect_one_hit(page: Page, title: str, marked: str) -> Locator:
    """Exactly one result: the chat titled `title`, its excerpt marking `marked`."""
    links = search_results(page).get_by_role("link")
    expect(links).to_have_count(1)
    hit = links.first
    expect(hit).to_have_accessible_name(re.compile("^" + re.escape(title) + r"\b"))
    expect(hit.locator("mark").first).to_have_text(marked)
    return hit


def _no_match(area: Locator, text: str) -> None:
    """The area says so (as text: the announcement is the page's search status)."""
    shown = " ".join(text[:MAX_QUERY_CHARS].split())
    expect(area.locator(".empty")).to_have_text(f"No chat matches “{shown}”.")
    expect(area.page.locator("#search-status")).to_have_text("No chat matches")


def test_words_only_in_a_reply_or_an_older_version_are_found_as_you_type(
    numbered_app: EndpointApp, open_page: Callable[..., Page]
) -> None:
    title = "tell me about herons"
    page = open_page(numbered_app.server)
    chat_url = open_new_chat(page)
    old = _reply_number(numbered_app, page, title)
    new = str(int(old) + 1)
    regenerate_button(replies(page).first).click()
    expect(replies(page).first).to_contain_text(numbered_reply(int(new)))
    wait_status(page, "completed")
    expect(replies(page).first).not_to_contain_text(numbered_reply(int(old)))

    page.goto("/")
    # Typed key by key, never submitted: the list comes from the live results alone.
    search_box(page).press_sequentially(old, delay=60)
    hit = _expect_one_hit(page, title, old)
    expect(page).to_have_url(re.compile(r"/$"))
    hit.click()
    expect(page).to_have_url(chat_url)
    expect(page.get_by_role("heading", level=1)).to_have_text(title)

    # Ctrl+K from the message box, then type: the shown reply's number finds it too.
    message_box(page).click()
    page.keyboard.press("Control+k")
    expect(search_box(page)).to_be_focused()
    page.keyboard.type(new, delay=60)
    _expect_one_hit(page, title, new)


def test_most_recently_active_first_and_a_deleted_chat_is_no_longer_found(
    numbered_app: EndpointApp, open_page: Callable[..., Page]
) -> None:
    page = open_page(numbered_app.server)
    first = open_new_chat(page)
    _reply_number(numbered_app, page, "tell me about ospreys")
    second = open_new_chat(page)
    doomed = "tell me about ospreys and kites"
    number = _reply_number(numbered_app, page, doomed)
    _live_search(page, "ospreys")
    assert _hits(page) == [_path(second), _path(first)]
    _live_search(page, "kites")
    _expect_one_hit(page, doomed, "kites")

    page.goto(first)
    _reply_number(numbered_app, page, "and their nests")
    _live_search(page, "ospreys")
    assert _hits(page) == [_path(first), _path(second)]

    page.goto(second)
    page.once("dialog", lambda dialog: dialog.accept())
    open_chat_options(page)
    button(page, "Delete chat").click()
    expect(page).not_to_have_url(second)
    page.wait_for_load_state()
    _live_search(page, "ospreys")
    assert _hits(page) == [_path(first)]
    for word in ("kites", number):
        _no_match(_live_search(page, word), word)


def test_ctrl_k_and_cmd_k_focus_the_search_box_and_keep_the_browser_out(
    numbered_app: EndpointApp, open_page: Callable[..., Page]
) -> None:
    page = open_page(numbered_app.server)
    page.goto("/")  # the home page has the message box too: no chat needed
    # Seen last, after the page's own handlers: was the browser's default prevented?
    page.evaluate(
        """() => { window.__prevented = [];
                   window.addEventListener('keydown', e => {
                     if (e.key === 'k') window.__prevented.push(e.defaultPrevented); }); }"""
    )
    search_box(page).fill("earlier words")
    for keys in ("Control+k", "Meta+k"):
        message_box(page).click()
        expect(search_box(page)).not_to_be_focused()
        page.keyboard.press(keys)
        expect(search_box(page)).to_be_focused()
    # What was in the box is selected, so typing replaces it.
    page.keyboard.type("herons")
    expect(search_box(page)).to_have_value("herons")
    # A plain k is just a letter in the message box.
    message_box(page).click()
    page.keyboard.press("k")
    expect(message_box(page)).to_have_value("k")
    expect(message_box(page)).to_be_focused()
    assert page.evaluate("() => window.__prevented") == [True, True, False]


def test_hostile_queries_show_results_or_no_match_and_never_run(
    numbered_app: EndpointApp, open_page: Callable[..., Page]
) -> None:
    page = open_page(numbered_app.server)
    dialogs: list[str] = []
    errors: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("pageerror", lambda error: errors.append(str(error)))
    open_new_chat(page)
    # A chat holding the markup as text: that query has a hit, its excerpt shows it.
    _reply_number(numbered_app, page, f"look at {HOSTILE_MARKUP} here")
    for query in HOSTILE_QUERIES:
        area = _live_search(page, query)
        status = area.locator(".empty")
        expect(status.or_(search_results(page))).to_be_visible()
        if query == HOSTILE_MARKUP:
            expect(search_results(page).get_by_role("link").first).to_contain_text(query)
        elif status.count():
            _no_match(area, query)
        expect(area.locator("img, b, script")).to_have_count(0)
        expect(page.locator("#composer-alert")).to_have_text("")
    assert not dialogs, f"a query ran as script: {dialogs}"
    assert not errors, f"a query broke the page: {errors}"
    assert page.evaluate("() => document.querySelectorAll('[onerror]').length") == 0


def test_search_without_javascript_is_a_form_that_loads_the_search_page(
    numbered_app: EndpointApp, open_page: Callable[..., Page]
) -> None:
    title = "tell me about pelicans"
    setup = open_page(numbered_app.server)
    chat_url = open_new_chat(setup)
    number = _reply_number(numbered_app, setup, title)

    page = open_page(numbered_app.server, java_script_enabled=False)
    page.goto("/")
    search_box(page).fill(number)
    search_box(page).press("Enter")
    expect(page).to_have_url(re.compile(rf"/search\?q={number}$"))
    expect(page.get_by_role("heading", level=1)).to_have_text("Search chats")
    expect(page.get_by_role("main").get_by_role("status")).to_have_text(
        re.compile(rf"^1 chat match(es)? “{number}”, most recently active first\.$")
    )
    expect(search_box(page)).to_have_value(number)
    _expect_one_hit(page, title, number)

    # Markup typed into the form comes back as text, in the box and in the page.
    search_box(page).fill(HOSTILE_MARKUP)
    search_box(page).press("Enter")
    expect(page).to_have_url(re.compile(r"/search\?q=%3Cimg"))
    expect(search_box(page)).to_have_value(HOSTILE_MARKUP)
    expect(page.get_by_role("main").get_by_role("status")).to_contain_text(HOSTILE_MARKUP)
    expect(page.locator("img")).to_have_count(0)

    search_box(page).fill("pelicans")
    search_box(page).press("Enter")
    _expect_one_hit(page, title, "pelicans").click()
    expect(page).to_have_url(chat_url)
    expect(page.get_by_role("heading", level=1)).to_have_text(title)
