"""Rename and delete-with-confirmation from the chat's options menu.

SPEC §6 names no controls for these, so the names used here are the app's own
("Chat options", "Title", "Rename", "Delete chat"); the behaviour is the issue's.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import Dialog, Page, expect

from .harness import AppFactory, AppServer
from .ui import button, open_new_chat, send_and_wait

NAV = "nav[aria-label=Chats]"


@pytest.fixture
def app(start_app: AppFactory) -> AppServer:
    """A server per test: these tests count the chats in the list."""
    return start_app()


def _two_chats(page: Page) -> tuple[str, str]:
    first = open_new_chat(page)
    send_and_wait(page, "count to 2")
    second = open_new_chat(page)
    send_and_wait(page, "count to 3")
    return first, second


def _open_menu(page: Page) -> None:
    page.get_by_text("Chat options", exact=True).click()


def test_rename_changes_the_title_in_the_list_and_heading(page: Page) -> None:
    first, _ = _two_chats(page)
    page.goto(first)
    _open_menu(page)
    page.get_by_label("Title", exact=True).fill("Renamed alpha")
    button(page, "Rename").click()
    nav = page.locator(NAV)
    expect(nav.get_by_role("link", name="Renamed alpha", exact=True)).to_be_visible()
    expect(page.get_by_role("heading", level=1)).to_have_text("Renamed alpha")
    page.reload()
    expect(nav.get_by_role("link", name="Renamed alpha", exact=True)).to_be_visible()
    expect(nav.get_by_role("link", name="count to 3", exact=True)).to_be_visible()


def test_delete_asks_first_and_only_deletes_when_confirmed(page: Page) -> None:
    first, second = _two_chats(page)
    nav = page.locator(NAV)
    page.goto(first)
    expect(nav.get_by_role("link")).to_have_count(2)

    questions: list[str] = []

    def answer(accept: bool) -> Callable[[Dialog], None]:
        def handle(dialog: Dialog) -> None:
            questions.append(dialog.message)
            if accept:
                dialog.accept()
            else:
                dialog.dismiss()

        return handle

    page.once("dialog", answer(False))
    _open_menu(page)
    button(page, "Delete chat").click()
    expect(page).to_have_url(first)
    expect(nav.get_by_role("link")).to_have_count(2)
    assert questions and re.search(r"delete", questions[0], re.IGNORECASE), questions

    page.once("dialog", answer(True))
    button(page, "Delete chat").click()
    expect(page).not_to_have_url(first)
    expect(nav.get_by_role("link", name="count to 2", exact=True)).to_have_count(0)
    expect(nav.get_by_role("link", name="count to 3", exact=True)).to_be_visible()
    response = page.goto(first)
    assert response is not None and response.status == 404
    still_there = page.goto(second)
    assert still_there is not None and still_there.status == 200


def test_delete_without_javascript_goes_through_a_confirmation_page(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    setup = open_page(app)
    first, _ = _two_chats(setup)
    page = open_page(app, java_script_enabled=False)
    page.goto(first)
    # Without JavaScript a <details> still opens on click: it is plain HTML.
    _open_menu(page)
    button(page, "Delete chat").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Delete")
    expect(page.get_by_role("heading", level=1)).to_contain_text("count to 2")
    button(page, "Delete chat").click()
    expect(page).not_to_have_url(first)
    expect(page.locator(NAV).get_by_role("link", name="count to 2", exact=True)).to_have_count(0)
    response = page.goto(first)
    assert response is not None and response.status == 404
