"""SPEC §18: no WCAG 2.1 AA violation that axe-core finds, on the pages a person meets.

axe-core comes from npm like the reference MCP servers (`tests/mcp_servers/`, see the
README's test command) and runs inside the page, on the DOM Chromium really built:
sign-in, home, a chat (finished, with versions, editing, menus open, streaming, refused
with 409, stopped, waiting for a tool decision, in dark mode), the delete confirmation,
the Tools page, /admin/users (also at 320 px), search (the page and as you type) and
404s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from .harness import REPO_ROOT, AppFactory, AppServer
from .ui import (
    TOOL,
    button,
    expect_skip_link_lands,
    last_reply,
    message_box,
    open_new_chat,
    search_box,
    send,
    send_and_wait,
    wait_status,
)

AXE_JS = REPO_ROOT / "tests" / "mcp_servers" / "node_modules" / "axe-core" / "axe.min.js"
PASSWORD = "a long enough password"

# WCAG 2.0 and 2.1, levels A and AA. label-content-name-mismatch (WCAG 2.5.3) is tagged
# "experimental" by axe and so off by default: the audit ran it, and so do we.
_RUN_AXE = """
async () => {
  const results = await axe.run(document, {
    runOnly: {type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]},
    rules: {"label-content-name-mismatch": {enabled: true}},
    resultTypes: ["violations"],
  });
  return results.violations.map(v => ({
    id: v.id, help: v.help,
    nodes: v.nodes.map(n => n.target.join(" ") + ": " + n.failureSummary),
  }));
}
"""


def axe_violations(page: Page) -> list[dict[str, object]]:
    """Every WCAG 2.1 AA violation axe-core finds in the page as it is now."""
    if not AXE_JS.exists():
        pytest.fail(f"{AXE_JS} is missing: run `npm install --prefix tests/mcp_servers` first")
    if not page.evaluate("() => typeof axe !== 'undefined'"):
        # Evaluated, not added as a <script>: the app's Content-Security-Policy (rightly)
        # refuses inline scripts, and DevTools' evaluation is not subject to it.
        page.evaluate(AXE_JS.read_text() + "\n;undefined")
    found: list[dict[str, object]] = page.evaluate(_RUN_AXE)
    return found


def expect_no_violations(page: Page, where: str) -> None:
    found = axe_violations(page)
    assert found == [], f"{where}: axe found\n{json.dumps(found, indent=2)}"


def _add_admin(db: Path, name: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEBAPP_", "OPENAI_"))}
    env["PYTHONPATH"] = str(REPO_ROOT)
    command = [sys.executable, "-m", "webapp", "users", "add", name, "--admin"]
    subprocess.run(
        [*command, "--password-stdin", "--db", str(db)],
        input=PASSWORD,
        text=True,
        check=True,
        capture_output=True,
        timeout=60,
        env=env,
    )


def _sign_in(page: Page, name: str) -> None:
    expect_skip_link_lands(page, "/login", "main")
    expect_no_violations(page, "the sign-in page")
    page.get_by_label("User name").fill(name)
    page.get_by_label("Password").fill(PASSWORD)
    button(page, "Sign in").click()
    expect(page.locator(".sidebar .account")).to_contain_text(f"Signed in as {name}")


def test_home_chat_admin_search_and_404_have_no_violation(
    start_app: AppFactory, open_page: Callable[..., Page], tmp_path: Path
) -> None:
    _add_admin(tmp_path / "chat.db", "alice")
    _add_admin(tmp_path / "chat.db", "bob")
    server = start_app("--auth", "password")
    page = open_page(server)
    _sign_in(page, "alice")
    page.goto("/")
    expect(message_box(page)).to_be_visible()
    expect_no_violations(page, "home")

    open_new_chat(page)
    send_and_wait(page, "count to 5")
    message_box(page).fill("tell me about pelicans")
    page.keyboard.press("Enter")
    wait_status(page, "completed", index=1)
    # Two versions of the last reply: the switcher is in the page too.
    button(last_reply(page), "Regenerate").click()
    expect(last_reply(page).get_by_role("group", name="Versions")).to_be_visible()
    wait_status(page, "completed")
    expect_no_violations(page, "a chat")

    button(page.locator("[data-role=user]").first, "Edit").click()
    expect(page.get_by_label("Edit message", exact=True)).to_be_visible()
    expect_no_violations(page, "a chat with a message being edited")

    page.reload()
    page.get_by_text("Chat options", exact=True).click()
    page.get_by_text("More", exact=True).click()
    expect(page.get_by_label("Chat file")).to_be_visible()
    expect_no_violations(page, "a chat with its menus open")

    search_box(page).fill("pelicans")
    expect(page.get_by_role("list", name="Search results")).to_be_visible()
    expect_no_violations(page, "search as you type")
    search_box(page).fill("nothing matches this")
    expect(page.locator("#search-results")).to_contain_text("No chat matches")
    expect_no_violations(page, "search as you type, no match")

    page.goto("/search?q=pelicans")
    expect_no_violations(page, "the search page")
    page.goto("/admin/users")
    expect(page.get_by_role("heading", name="Users", exact=True)).to_be_visible()
    expect_no_violations(page, "/admin/users")
    expect_skip_link_lands(page, "/admin/users", "main")
    # At 320 px the users table scrolls in a box of its own; the page does not.
    page.set_viewport_size({"width": 320, "height": 640})
    page.goto("/admin/users")
    sideways = "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    assert page.evaluate(sideways) <= 0, "at 320 px /admin/users scrolls sideways"
    table_box = page.get_by_role("region", name="Users table", exact=True)
    assert table_box.evaluate("box => box.scrollWidth > box.clientWidth"), "nothing to scroll?"
    table_box.focus()  # a keyboard user scrolls it with the arrow keys
    page.keyboard.press("ArrowRight")
    page.wait_for_function("() => document.activeElement.scrollLeft > 0")
    expect_no_violations(page, "/admin/users at 320 px")
    page.goto("/chats/no-such-chat")
    expect(page.get_by_role("heading", level=1)).to_contain_text("404")
    expect_no_violations(page, "a 404")
    page.goto("/no/such/address")
    expect_no_violations(page, "an unknown address")


def test_a_streaming_refused_stopped_and_deleted_chat_has_no_violation(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(app)
    chat = open_new_chat(page)
    send(page, "count to 3000")
    expect(last_reply(page)).to_contain_text("1 2 3")
    expect_no_violations(page, "a reply streaming")
    send(page, "a second message while the first runs")
    expect(page.locator("#composer-alert")).to_contain_text("still running")
    expect_no_violations(page, "the 409 notice")
    button(last_reply(page), "Stop").click()
    wait_status(page, "stopped")
    expect_no_violations(page, "a stopped reply")
    page.goto(chat + "/delete")
    expect(button(page, "Delete chat")).to_be_visible()
    expect_no_violations(page, "the delete confirmation")


def test_dark_mode_home_and_chat_have_no_violation(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(app, color_scheme="dark")
    open_new_chat(page)
    send_and_wait(page, "count to 3")
    expect_no_violations(page, "a chat in dark mode")


def test_tools_page_and_a_reply_waiting_for_approval_have_no_violation(
    tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(tools_app)
    page.goto("/tools")
    expect(page.get_by_role("heading", name="Tools", level=1)).to_be_visible()
    expect(page.locator(".tools-page")).to_contain_text("broken")
    expect_no_violations(page, "the Tools page")

    open_new_chat(page)
    send(page, 'call test__write_note {"text": "axe"}')
    reply = wait_status(page, "waiting")
    expect(button(reply.locator(TOOL), "Allow")).to_be_visible()
    expect_no_violations(page, "a reply waiting for approval")
