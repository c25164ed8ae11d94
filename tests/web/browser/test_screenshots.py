"""Screenshots of a real chat in light and dark themes, desktop and phone width.

They are saved under artifacts/screenshots/ (gitignored) for a human to look at; the
test also checks what can be checked mechanically: the theme really changes the
colours, and at 375 px nothing makes the page scroll sideways.
"""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import Page, expect

from .harness import REPO_ROOT, AppServer
from .ui import (
    TOOL,
    button,
    expect_version,
    message_box,
    open_new_chat,
    regenerate_button,
    replies,
    send,
    send_and_wait,
    users,
    versions,
    wait_for_numbers,
    wait_status,
)

SHOTS = REPO_ROOT / "artifacts" / "screenshots"
CODE_MESSAGE = (
    "Please review this function:\n\n"
    "```python\n"
    "def greet(name: str) -> str:\n"
    '    return f"Hello, {name}!"\n'
    "```\n"
)
# Scroll every scrolled ancestor of the first message (and the window) back to the top.
_SCROLL_TO_TOP_JS = """
() => {
  for (let e = document.querySelector('[data-role]'); e; e = e.parentElement) e.scrollTop = 0;
  window.scrollTo(0, 0);
}
"""
SIZES = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 375, "height": 740}}
PICNIC = (
    "Plan a picnic for Saturday: six people, one of them vegetarian, "
    "and we have to be home by five."
)


def _background(page: Page) -> str:
    """Page background and text colour: what a theme has to change."""
    colours: str = page.evaluate(
        """() => [document.documentElement, document.body]
              .map(e => getComputedStyle(e))
              .map(s => s.backgroundColor + ' / ' + s.color).join(' ; ')"""
    )
    return colours


def _shoot_start_and_end(page: Page, name: str) -> None:
    """Screenshots at the conversation's end and start; at no width may it scroll sideways."""
    page.screenshot(path=str(SHOTS / f"{name}-end.png"))
    page.evaluate(_SCROLL_TO_TOP_JS)
    page.screenshot(path=str(SHOTS / f"{name}-start.png"))
    overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{name}: page is {overflow}px too wide"
    for part in ("start", "end"):
        assert (SHOTS / f"{name}-{part}.png").stat().st_size > 5_000


def test_screenshots_light_and_dark(app: AppServer, open_page: Callable[..., Page]) -> None:
    setup = open_page(app)
    chat_url = open_new_chat(setup)
    send_and_wait(setup, "what is 12*(3+4)?")
    send_and_wait(setup, CODE_MESSAGE)
    send_and_wait(setup, "count to 12")

    SHOTS.mkdir(parents=True, exist_ok=True)
    backgrounds: dict[str, str] = {}
    for scheme in ("light", "dark"):
        for size_name, viewport in SIZES.items():
            page = open_page(app, color_scheme=scheme, viewport=viewport)
            page.goto(chat_url)
            expect(users(page)).to_have_count(3)
            wait_status(page, "completed")
            expect(page.locator(TOOL)).to_have_count(1)
            expect(page.locator("[data-role=assistant] pre code").first).to_be_visible()
            expect(message_box(page)).to_be_visible()
            # The conversation scrolls inside the page: one shot at its end (where the
            # app autoscrolls to), one at its start, where the tool card is.
            _shoot_start_and_end(page, f"chat-{scheme}-{size_name}")
            backgrounds[f"{scheme}-{size_name}"] = _background(page)
    assert backgrounds["light-desktop"] != backgrounds["dark-desktop"], (
        f"dark theme has the same background as light: {backgrounds}"
    )


def test_screenshots_of_versions_and_reply_actions(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    """A message and a reply with two versions each, and a stopped reply that can continue."""
    setup = open_page(app)
    chat_url = open_new_chat(setup)
    send_and_wait(setup, PICNIC)
    button(users(setup).first, "Edit").click()
    setup.get_by_label("Edit message", exact=True).fill(PICNIC.replace("Saturday", "Sunday"))
    button(setup, "Save and send").click()
    expect(versions(users(setup).first)).to_be_visible()
    wait_status(setup, "completed")
    regenerate_button(replies(setup).first).click()
    expect(versions(replies(setup).first)).to_be_visible()
    wait_status(setup, "completed")
    send(setup, "count to 2000")
    wait_for_numbers(setup, 40)
    button(setup, "Stop").click()
    wait_status(setup, "stopped")

    SHOTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        for size_name, viewport in SIZES.items():
            page = open_page(app, color_scheme=scheme, viewport=viewport)
            page.goto(chat_url)
            expect_version(users(page).first, 2, 2)
            expect_version(replies(page).first, 2, 2)
            expect(button(replies(page).last, "Continue")).to_be_visible()
            expect(button(users(page).first, "Copy")).to_be_visible()
            _shoot_start_and_end(page, f"versions-{scheme}-{size_name}")


def test_screenshots_of_a_refused_send_and_a_stopped_reply(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    variants = [("light", "desktop"), ("dark", "phone")]
    for scheme, size_name in variants:
        page = open_page(app, color_scheme=scheme, viewport=SIZES[size_name])
        open_new_chat(page)
        send(page, "count to 2000")
        wait_for_numbers(page, 40)
        send(page, "this one has to wait")
        expect(page.get_by_role("alert")).to_be_visible()
        expect(button(page, "Stop")).to_be_visible()
        page.screenshot(path=str(SHOTS / f"states-{scheme}-{size_name}-refused.png"))
        button(page, "Stop").click()
        wait_status(page, "stopped")
        page.screenshot(path=str(SHOTS / f"states-{scheme}-{size_name}-stopped.png"))
