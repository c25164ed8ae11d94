"""Autoscroll follows a streaming reply, and stops following once the user scrolls up."""

from __future__ import annotations

import time
from collections.abc import Callable

from playwright.sync_api import Page

from .harness import AppServer
from .ui import button, last_reply, open_new_chat, send, wait_for_numbers, wait_status

# Where the reply scrolls: its nearest scrollable ancestor, else the document.
_SCROLL_JS = """
reply => {
  let e = reply.parentElement;
  while (e && !(e.scrollHeight > e.clientHeight
                && /(auto|scroll)/.test(getComputedStyle(e).overflowY))) e = e.parentElement;
  e = e || document.scrollingElement;
  return {top: e.scrollTop, fromBottom: e.scrollHeight - e.clientHeight - e.scrollTop,
          height: e.clientHeight};
}
"""


def _scroll(page: Page) -> dict[str, float]:
    position: dict[str, float] = last_reply(page).evaluate(_SCROLL_JS)
    return position


def test_autoscroll_follows_the_stream_until_the_user_scrolls_up(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(app, viewport={"width": 375, "height": 640})
    open_new_chat(page)
    send(page, "count to 1000")
    wait_for_numbers(page, 400)  # several screens of numbers at 375 px
    following = _scroll(page)
    assert following["top"] > 0, f"the conversation never scrolled: {following}"
    assert following["fromBottom"] < 80, f"autoscroll is not following the stream: {following}"

    box = last_reply(page).bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + 20, min(box["y"] + box["height"] - 20, 300))
    page.mouse.wheel(0, -600)
    page.wait_for_function(
        f"() => {{ const r = document.querySelectorAll('[data-role=assistant]');"
        f" return ({_SCROLL_JS})(r[r.length - 1]).fromBottom > 300; }}",
        timeout=5_000,
    )
    scrolled_up = _scroll(page)
    # About a second of streaming (~100 more numbers) must not pull the reader back down.
    time.sleep(1.0)
    later = _scroll(page)
    assert abs(later["top"] - scrolled_up["top"]) < 5, (
        f"autoscroll moved the page after the user scrolled up: {scrolled_up} -> {later}"
    )
    assert later["fromBottom"] > 300
    # Done: no need to wait for the other ~600 numbers.
    button(page, "Stop").click()
    wait_status(page, "stopped")
