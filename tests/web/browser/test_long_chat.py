"""A 500-message chat opens at its latest messages; scrolling up loads the rest once each."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from playwright.sync_api import Page, expect
from webhelpers import write_long_chat

from .harness import AppFactory

RUNS = 250  # 500 messages

_TEXTS_JS = """
() => Array.from(document.querySelectorAll('[data-role=user], [data-role=assistant]'))
  .map(m => m.querySelector('.content').textContent.trim())
"""


def test_scrolling_up_a_500_message_chat_shows_every_message_once_in_order(
    start_app: AppFactory, open_page: Callable[..., Page], tmp_path: Path
) -> None:
    # Playwright's sync API runs an event loop in this thread: write from another.
    with ThreadPoolExecutor(1) as pool:
        chat_id = pool.submit(
            asyncio.run, write_long_chat(tmp_path / "chat.db", "A long conversation", RUNS)
        ).result()
    server = start_app()
    page = open_page(server)
    page.goto(f"/chats/{chat_id}")
    expect(page.locator("[data-role=assistant] .content").last).to_have_text("answer 249")
    first_page = page.evaluate(_TEXTS_JS)
    assert len(first_page) < 100  # it opened at the latest messages, not all 500
    earlier = page.get_by_role("link", name="Load earlier messages", exact=True)
    pages = 1
    for _ in range(RUNS):  # bounded: each round loads at least one page
        if earlier.count() == 0:
            break
        shown = page.locator("[data-role=user]").count()
        page.locator("#conversation").evaluate("el => { el.scrollTop = 0; }")
        page.wait_for_function(
            "n => document.querySelectorAll('[data-role=user]').length > n", arg=shown
        )
        pages += 1
    # One page per scroll to the top: what the user was reading stays in view.
    assert pages == RUNS // 25
    expected = [t for n in range(RUNS) for t in (f"question {n}", f"answer {n}")]
    assert page.evaluate(_TEXTS_JS) == expected
