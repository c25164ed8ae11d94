"""Real tools in the chat (SPEC §11): MCP servers over real stdio, calls that ask first, and
what Allow, Always allow, Deny, Stop, reloads and kill -9 do to them, in a real Chromium.

The model is the fake endpoint's "tools" mode: "call TOOL {arguments}" makes it call that
tool. The tools are tests/mcp_server.py's, whose traces (notes.txt, slow.log) say what the
server really did, and the reference filesystem server from npm. One app serves the module;
the tests that kill it start their own.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

from .harness import (
    TOOL_ANSWER,
    AppFactory,
    AppServer,
    FakeEndpoint,
    tools_args,
    write_tools_config,
)
from .ui import (
    TOOL,
    button,
    last_reply,
    message_box,
    open_new_chat,
    recorded_states,
    replies,
    send,
    users,
    wait_status,
)


def traces(server: AppServer) -> Path:
    return server.db.parent


def notes(server: AppServer) -> list[str]:
    path = traces(server) / "notes.txt"
    return path.read_text().splitlines() if path.exists() else []


def call(page: Page, tool: str, **arguments: object) -> None:
    send(page, f"call {tool} {json.dumps(arguments)}")


def waiting_card(page: Page) -> Locator:
    """The card of the call the last reply waits for."""
    reply = wait_status(page, "waiting")
    card = reply.locator(f"{TOOL}[data-approval=waiting]")
    expect(card).to_have_count(1)
    expect(card).to_contain_text("Waiting for approval")
    for name in ("Allow", "Always allow", "Deny"):
        expect(button(card, name)).to_be_visible()
    expect(button(reply, "Stop")).to_be_visible()
    return card


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def expect_answered(page: Page, text: str) -> Locator:
    reply = wait_status(page, "completed")
    expect(reply.locator(".content")).to_contain_text(f"{TOOL_ANSWER} {text}")
    return reply


# --- decisions ---------------------------------------------------------------------------


def test_allow_runs_the_call_once_and_the_reply_goes_on(
    tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(tools_app)
    open_new_chat(page)
    call(page, "test__write_note", text="allow-1")
    card = waiting_card(page)
    expect(card).to_contain_text('"text": "allow-1"')
    expect(card).to_contain_text("test__write_note")
    expect(card).not_to_contain_text("may have run already")
    assert "allow-1" not in notes(tools_app)  # nothing runs before the decision
    button(card, "Allow").click()
    reply = expect_answered(page, "wrote 'allow-1'")
    expect(reply.locator(TOOL)).to_contain_text("Allowed")
    assert notes(tools_app).count("allow-1") == 1
    page.reload()
    expect(last_reply(page).locator(TOOL)).to_contain_text("Allowed")
    expect(button(last_reply(page), "Allow")).to_have_count(0)


def test_deny_gives_the_model_the_refusal(
    tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(tools_app)
    open_new_chat(page)
    call(page, "test__write_note", text="deny-1")
    button(waiting_card(page), "Deny").click()
    reply = expect_answered(page, "The user declined to run this tool.")
    card = reply.locator(TOOL)
    expect(card).to_contain_text("Denied")
    expect(card).to_have_attribute("data-error", "true")
    assert "deny-1" not in notes(tools_app)


def test_always_allow_holds_in_that_chat_and_not_in_another(
    tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(tools_app)
    open_new_chat(page)
    call(page, "test__write_note", text="always-1")
    button(waiting_card(page), "Always allow").click()
    expect_answered(page, "wrote 'always-1'")
    before = len(recorded_states(page))
    call(page, "test__write_note", text="always-2")
    expect(replies(page)).to_have_count(2)
    expect_answered(page, "wrote 'always-2'")
    seen = {r["status"] for s in recorded_states(page)[before:] for r in s["replies"][1:]}
    assert "waiting" not in seen, "the granted tool asked again in the same chat"
    assert notes(tools_app).count("always-2") == 1
    # Another chat does not inherit the grant.
    open_new_chat(page)
    call(page, "test__write_note", text="always-3")
    waiting_card(page)
    assert "always-3" not in notes(tools_app)


# Two posts of one Allow form at once, as a double click that nothing debounces sends
# them (htmx drops a second request from a busy element, and so does Chromium's own
# navigation; a script, a retrying proxy or another browser need not).
_POST_TWICE = """
form => Promise.all([1, 2].map(() => fetch(form.action, {
  method: "POST", body: new URLSearchParams(new FormData(form)),
}).then(r => r.status)))
"""


def test_a_double_click_and_a_second_tab_execute_once(
    tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    first, second = open_page(tools_app), open_page(tools_app)
    url = open_new_chat(first)
    call(first, "test__write_note", text="double-1")
    card = waiting_card(first)
    second.goto(url)
    other = waiting_card(second)
    form = button(card, "Allow").locator("xpath=ancestor::form")
    assert form.evaluate(_POST_TWICE) == [200, 200]  # each answered with the chat page
    button(card, "Allow").dblclick()  # the card still shown here: two more clicks
    button(other, "Allow").click()
    expect_answered(first, "wrote 'double-1'")
    expect_answered(second, "wrote 'double-1'")
    assert notes(tools_app).count("double-1") == 1
    for page in (first, second):
        page.reload()
        expect(replies(page)).to_have_count(1)
        expect(last_reply(page).locator(TOOL)).to_contain_text("Allowed")


# --- Stop and refusals while it waits ----------------------------------------------------------


def test_stop_while_it_waits_ends_a_stopped_reply(
    tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(tools_app)
    open_new_chat(page)
    call(page, "test__write_note", text="stop-1")
    waiting_card(page)
    button(last_reply(page), "Stop").click()
    reply = wait_status(page, "stopped")
    expect(reply.get_by_text("Stopped", exact=True)).to_be_visible()
    expect(reply.locator(TOOL)).to_have_count(0)  # the waiting call is dropped
    page.reload()
    expect(wait_status(page, "stopped").locator(TOOL)).to_have_count(0)
    call(page, "test__echo", text="after the stop")
    expect_answered(page, "after the stop")
    assert "stop-1" not in notes(tools_app)


def test_while_it_waits_a_send_is_refused_with_409(
    tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(tools_app)
    open_new_chat(page)
    call(page, "test__write_note", text="busy-1")
    waiting_card(page)
    message_box(page).fill("another message")
    with page.expect_response(re.compile(r"/messages$")) as refused:
        button(page, "Send").click()
    assert refused.value.status == 409
    expect(page.get_by_role("alert").filter(has_text="still running")).to_be_visible()
    expect(message_box(page)).to_have_value("another message")
    expect(users(page)).to_have_count(1)
    waiting_card(page)


def test_stop_during_a_long_mcp_call_cancels_it_on_the_server(
    tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(tools_app)
    log = traces(tools_app) / "slow.log"
    open_new_chat(page)
    call(page, "test__slow", seconds=60)
    button(waiting_card(page), "Allow").click()
    wait_until(lambda: log.exists() and log.read_text().count("started") == 1, "slow to start")
    expect(last_reply(page).locator(TOOL)).to_contain_text("running")
    button(last_reply(page), "Stop").click()
    reply = wait_status(page, "stopped")
    expect(reply.locator(TOOL)).to_have_count(0)
    wait_until(lambda: "cancelled" in log.read_text(), "the server to be told to cancel")


def test_without_javascript_the_card_works_as_plain_forms(
    tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(tools_app, java_script_enabled=False)
    page.goto("/")
    button(page, "New chat").click()
    message_box(page).fill('call test__write_note {"text": "nojs-1"}')
    button(page, "Send").click()
    expect(page).to_have_url(re.compile(r"/chats/[^/]+$"))
    reload_until(page, "waiting")  # what a reader without script does: reload
    card = last_reply(page).locator(f"{TOOL}[data-approval=waiting]")
    expect(card).to_contain_text("Waiting for approval")
    assert "nojs-1" not in notes(tools_app)
    button(card, "Allow").click()
    expect(page).to_have_url(re.compile(r"/chats/[^/]+$"))
    reload_until(page, "completed")
    expect(last_reply(page).locator(".content")).to_contain_text("wrote 'nojs-1'")
    expect(last_reply(page).locator(TOOL)).to_contain_text("Allowed")
    assert notes(tools_app).count("nojs-1") == 1


def reload_until(page: Page, status: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while last_reply(page).get_attribute("data-status") != status:
        assert time.monotonic() < deadline, f"the reply never showed as {status} on reload"
        time.sleep(0.3)
        page.reload()


# --- the servers ---------------------------------------------------------------------------


def test_the_filesystem_server_writes_a_file_once_allowed(
    tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(tools_app)
    target = traces(tools_app) / "share" / "hello.txt"
    open_new_chat(page)
    call(page, "files__write_file", path=str(target), content="hello from the chat")
    waiting_card(page)
    assert not target.exists()
    button(waiting_card(page), "Allow").click()
    wait_status(page, "completed")
    assert target.read_text() == "hello from the chat"
    call(page, "files__read_text_file", path=str(target))  # read-only: it runs unasked
    expect(replies(page)).to_have_count(2)
    expect_answered(page, "hello from the chat")


def test_the_tools_page_shows_each_server_and_a_failing_one(
    tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(tools_app)
    page.goto("/")
    page.get_by_role("link", name="Tools", exact=True).click()
    expect(page).to_have_url(re.compile(r"/tools$"))
    broken = page.locator("[data-server=broken]")
    expect(broken).to_have_attribute("data-status", "failed")
    expect(broken.get_by_role("alert")).to_contain_text("command not found")
    test = page.locator("[data-server=test]")
    expect(test).to_have_attribute("data-status", "connected")
    expect(test.locator("tr[data-tool=test__write_note] .policy")).to_have_text("ask")
    expect(test.locator("tr[data-tool=test__echo] .policy")).to_have_text("allow · read-only")
    files = page.locator("[data-server=files]")
    expect(files.locator("tr[data-tool=files__read_text_file] .policy")).to_contain_text("allow")
    expect(page.locator("tr[data-tool=calculator] .policy")).to_have_text("allow")


# --- kill -9 -----------------------------------------------------------------------------------


@pytest.fixture
def own_tools_app(
    start_app: AppFactory, tmp_path: Path, fake_endpoint: Callable[[str], FakeEndpoint]
) -> AppServer:
    return start_app(*tools_args(fake_endpoint("tools"), write_tools_config(tmp_path)))


def test_a_reload_and_a_kill_9_while_it_waits_lose_nothing_and_run_nothing(
    own_tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    server = own_tools_app
    page = open_page(server)
    url = open_new_chat(page)
    call(page, "test__write_note", text="kill-1")
    waiting_card(page)
    page.reload()
    waiting_card(page)
    server.kill()
    assert notes(server) == []
    server.start()
    page.goto(url)
    card = waiting_card(page)
    assert notes(server) == []  # the restart ran nothing by itself
    button(card, "Allow").click()
    expect_answered(page, "wrote 'kill-1'")
    page.reload()
    expect(last_reply(page).locator(TOOL)).to_contain_text("Allowed")
    assert notes(server) == ["kill-1"]


def test_a_kill_9_during_a_call_that_must_not_rerun_asks_again(
    own_tools_app: AppServer, open_page: Callable[..., Page]
) -> None:
    server = own_tools_app
    log = traces(server) / "slow.log"
    page = open_page(server)
    url = open_new_chat(page)
    call(page, "test__slow", seconds=4)
    button(waiting_card(page), "Allow").click()
    wait_until(lambda: log.exists() and "started" in log.read_text(), "slow to start")
    server.kill()
    server.start()
    page.goto(url)
    card = waiting_card(page)
    expect(card).to_contain_text("may have run already")
    assert log.read_text().count("started") == 1  # not re-run by itself
    button(card, "Allow").click()
    expect_answered(page, "slept")
    assert log.read_text().count("started") == 2
