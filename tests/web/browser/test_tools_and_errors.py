"""Tool calls show as cards; a failing model endpoint shows its error and loses nothing."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import Page, expect

from .harness import ANSWER_TEXT, PROVIDER_ERROR, REASONING_TEXT, AppFactory, FakeEndpoint
from .ui import (
    TOOL,
    last_reply,
    normalized,
    open_new_chat,
    replies,
    reply_states,
    send,
    users,
    wait_status,
)


def _assert_calculator_card(page: Page) -> None:
    card = page.locator(TOOL)
    expect(card).to_have_count(1)
    expect(card).to_contain_text("calculator")
    expect(card).to_contain_text("12*(3+4)")
    expect(card).to_contain_text("84")
    expect(card).not_to_have_attribute("data-error", "true")


def test_calculator_tool_card_and_reply(page: Page) -> None:
    open_new_chat(page)
    send(page, "what is 12*(3+4)?")
    wait_status(page, "completed")
    _assert_calculator_card(page)
    reply = reply_states(page)[-1]
    assert reply.text is not None and "84" in reply.text, f"reply: {reply.text!r}"

    page.reload()
    wait_status(page, "completed")
    _assert_calculator_card(page)
    expect(users(page)).to_have_count(1)
    expect(replies(page)).to_have_count(1)


def test_endpoint_error_is_shown_and_the_message_kept(
    fake_endpoint: Callable[[str], FakeEndpoint],
    start_app: AppFactory,
    open_page: Callable[..., Page],
) -> None:
    endpoint = fake_endpoint("error")
    server = start_app("--base-url", endpoint.base_url, "--model", "test")
    page = open_page(server)
    open_new_chat(page)
    send(page, "hello endpoint")

    def assert_failed_reply() -> None:
        reply = wait_status(page, "failed")
        alert = reply.get_by_role("alert")
        expect(alert).to_be_visible()
        expect(alert).to_contain_text("500")
        expect(alert).to_contain_text(PROVIDER_ERROR)
        expect(users(page)).to_have_count(1)
        expect(users(page).first).to_contain_text("hello endpoint")

    assert_failed_reply()
    assert endpoint.requests, "the app never called the configured endpoint"
    request = endpoint.requests[0]
    assert request.get("model") == "test"
    sent = [m.get("content") for m in request.get("messages", []) if isinstance(m, dict)]
    assert "hello endpoint" in sent, f"the endpoint did not receive the message: {sent}"
    page.reload()
    assert_failed_reply()
    assert reply_states(page)[-1].run_id, "the failed reply has no data-run-id"


def test_failing_tool_shows_an_error_card_and_the_run_goes_on(page: Page) -> None:
    open_new_chat(page)
    send(page, "what is 1/0?")
    wait_status(page, "completed")
    card = page.locator(TOOL)
    expect(card).to_have_count(1)
    expect(card).to_have_attribute("data-error", "true")
    expect(card).to_contain_text("calculator")
    expect(card).to_contain_text("1/0")
    expect(card).to_contain_text("division by zero")
    reply = reply_states(page)[-1]
    assert reply.text and "1/0" in reply.text, f"no reply after the tool error: {reply.text!r}"


def test_reasoning_is_collapsed_under_its_summary(
    fake_endpoint: Callable[[str], FakeEndpoint],
    start_app: AppFactory,
    open_page: Callable[..., Page],
) -> None:
    endpoint = fake_endpoint("reasoning")
    server = start_app("--base-url", endpoint.base_url, "--model", "test")
    page = open_page(server)
    open_new_chat(page)
    send(page, "think first")

    def assert_collapsed_then_open() -> None:
        wait_status(page, "completed")
        details = last_reply(page).locator("details")
        expect(details).to_have_count(1)
        expect(details).not_to_have_attribute("open", "")
        summary = details.locator("summary")
        expect(summary).to_have_text("Reasoning")
        expect(details.get_by_text(REASONING_TEXT)).to_be_hidden()
        assert normalized(reply_states(page)[-1].text) == ANSWER_TEXT
        summary.click()
        expect(details.get_by_text(REASONING_TEXT)).to_be_visible()

    assert_collapsed_then_open()
    page.reload()
    assert_collapsed_then_open()
