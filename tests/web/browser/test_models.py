"""Models per chat in a real Chromium (SPEC §12), against two real endpoints on loopback.

Each endpoint is an OpenAI-compatible HTTP server of its own (`ModelsEndpoint`): it
lists its models at ``GET /v1/models`` and streams chat completions naming itself
and the model asked, with the usage it reports. A third endpoint in the config file
is dead (nothing listens on its port). No llama.cpp server is available here: these
servers stand in for any OpenAI-compatible one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

from .harness import AppFactory, AppServer, ModelsEndpoint, free_port
from .test_screenshots import SHOTS, SIZES
from .ui import (
    button,
    expect_version,
    message_box,
    open_chat_options,
    open_new_chat,
    regenerate_button,
    replies,
    send,
    send_and_wait,
    switch_version,
    wait_status,
)

PRESET_INSTRUCTIONS = "Answer like a telegram."


@pytest.fixture(scope="module")
def endpoints() -> Iterator[tuple[ModelsEndpoint, ModelsEndpoint]]:
    alpha = ModelsEndpoint(name="alpha", models=["a-small", "a-large"])
    beta = ModelsEndpoint(name="beta", models=["b-chat"])
    alpha.start()
    beta.start()
    yield alpha, beta
    alpha.stop()
    beta.stop()


def write_config(path: Path, alpha: ModelsEndpoint, beta: ModelsEndpoint, dead_port: int) -> Path:
    path.write_text(
        f"""
[[endpoints]]
name = "alpha"
base_url = "{alpha.base_url}"

[[endpoints]]
name = "beta"
base_url = "{beta.base_url}"

[[endpoints]]
name = "dead"
base_url = "http://127.0.0.1:{dead_port}/v1"

[[presets]]
name = "Telegram"
model = "beta/b-chat"
instructions = "{PRESET_INSTRUCTIONS}"
temperature = 0.3
"""
    )
    return path


@pytest.fixture
def models_app(
    start_app: AppFactory, endpoints: tuple[ModelsEndpoint, ModelsEndpoint], tmp_path: Path
) -> tuple[AppServer, ModelsEndpoint, ModelsEndpoint, int]:
    alpha, beta = endpoints
    dead_port = free_port()  # nothing listens there
    config = write_config(tmp_path / "app.toml", alpha, beta, dead_port)
    return start_app("--config", str(config)), alpha, beta, dead_port


def picker(page: Page) -> Locator:
    return page.get_by_label("Model", exact=True)


def choose(page: Page, name: str) -> None:
    """Choose a model in the picker and wait until the app has saved it."""
    with page.expect_response(lambda r: r.url.endswith("/model") and r.status == 204):
        picker(page).select_option(name)


def usage_of(reply: Locator) -> tuple[int, int]:
    tokens_in, tokens_out = (
        reply.get_attribute("data-tokens-in"),
        reply.get_attribute("data-tokens-out"),
    )
    assert tokens_in is not None and tokens_out is not None, "a finished reply shows its usage"
    return int(tokens_in), int(tokens_out)


def test_a_send_and_a_regenerate_each_go_to_the_chosen_endpoint(
    models_app: tuple[AppServer, ModelsEndpoint, ModelsEndpoint, int],
    open_page: Callable[..., Page],
) -> None:
    server, alpha, beta, _ = models_app
    page = open_page(server)
    open_new_chat(page)
    # The picker lists both endpoints' models; the dead one's are missing.
    options = picker(page).locator("option").all_inner_texts()
    assert options == ["alpha/a-small", "alpha/a-large", "beta/b-chat"], options
    choose(page, "alpha/a-large")
    asked_alpha, asked_beta = len(alpha.requests), len(beta.requests)
    send_and_wait(page, "hello there")
    assert len(alpha.requests) == asked_alpha + 1 and len(beta.requests) == asked_beta
    assert alpha.requests[-1]["model"] == "a-large"
    first = replies(page).first
    expect(first).to_have_attribute("data-model", "alpha/a-large")
    expect(first).to_contain_text(f"alpha/a-large reply #{asked_alpha + 1}.")
    # The usage shown is what the endpoint reported, on the reply and in the header.
    reported = alpha.reported[-1]
    assert usage_of(first) == reported
    expect(first.locator(".reply-usage")).to_have_text(
        f"{reported[0]:,} tokens in · {reported[1]:,} out"
    )
    expect(page.locator("#chat-usage")).to_have_text(
        f"This chat: {reported[0]:,} tokens in · {reported[1]:,} out"
    )

    # Regenerate with another model: choose it, press Regenerate.
    choose(page, "beta/b-chat")
    old_run = first.get_attribute("data-run-id") or ""
    regenerate_button(first).click()
    expect(first).not_to_have_attribute("data-run-id", old_run)
    wait_status(page, "completed", index=0)
    assert len(beta.requests) == asked_beta + 1 and beta.requests[-1]["model"] == "b-chat"
    expect(first).to_have_attribute("data-model", "beta/b-chat")
    expect(first).to_contain_text(f"beta/b-chat reply #{asked_beta + 1}.")
    expect(first.locator(".other-models")).to_have_text("other versions by alpha/a-large")
    expect_version(first, 2, 2)
    assert usage_of(first) == beta.reported[-1]
    both = (reported[0] + beta.reported[-1][0], reported[1] + beta.reported[-1][1])
    expect(page.locator("#chat-usage")).to_have_text(
        f"This chat: {both[0]:,} tokens in · {both[1]:,} out"
    )
    # Previous version shows the first model's reply, with its own model and usage.
    switch_version(first, "Previous version", 1, 2)
    expect(first).to_have_attribute("data-model", "alpha/a-large")
    expect(first).to_contain_text(f"alpha/a-large reply #{asked_alpha + 1}.")
    assert usage_of(first) == reported
    expect(first.locator(".other-models")).to_have_text("other versions by beta/b-chat")


def test_the_choice_survives_a_reload_and_a_restart(
    models_app: tuple[AppServer, ModelsEndpoint, ModelsEndpoint, int],
    open_page: Callable[..., Page],
) -> None:
    server, alpha, beta, _ = models_app
    page = open_page(server)
    chat_url = open_new_chat(page)
    choose(page, "beta/b-chat")
    page.reload()
    expect(picker(page)).to_have_value("beta/b-chat")
    server.stop()
    server.start()
    page.goto(chat_url)
    expect(picker(page)).to_have_value("beta/b-chat")
    asked_alpha, asked_beta = len(alpha.requests), len(beta.requests)
    send_and_wait(page, "after the restart")
    assert (len(alpha.requests), len(beta.requests)) == (asked_alpha, asked_beta + 1)
    expect(replies(page).last).to_have_attribute("data-model", "beta/b-chat")


def test_use_model_saves_the_choice_without_javascript(
    models_app: tuple[AppServer, ModelsEndpoint, ModelsEndpoint, int],
    open_page: Callable[..., Page],
) -> None:
    server, alpha, _beta, _ = models_app
    page = open_page(server, java_script_enabled=False)
    open_new_chat(page)
    picker(page).select_option("alpha/a-small")
    with page.expect_navigation():
        button(page, "Use model").click()
    expect(picker(page)).to_have_value("alpha/a-small")
    asked = len(alpha.requests)
    send(page, "no script here")
    # Without JavaScript the page reloads itself until the reply is complete.
    wait_status(page, "completed", timeout=20_000)
    assert len(alpha.requests) == asked + 1 and alpha.requests[-1]["model"] == "a-small"
    expect(replies(page).last).to_have_attribute("data-model", "alpha/a-small")
    assert usage_of(replies(page).last) == alpha.reported[-1]


def test_the_instructions_reach_the_model_as_its_system_message(
    models_app: tuple[AppServer, ModelsEndpoint, ModelsEndpoint, int],
    open_page: Callable[..., Page],
) -> None:
    server, alpha, _, _ = models_app
    page = open_page(server)
    open_new_chat(page)
    choose(page, "alpha/a-small")
    open_chat_options(page)
    page.get_by_label("Instructions", exact=True).fill("Always answer in haiku.")
    with page.expect_navigation():
        button(page, "Save instructions").click()
    send_and_wait(page, "write about rain")
    messages = alpha.requests[-1]["messages"]
    assert messages[0] == {"role": "system", "content": "Always answer in haiku."}
    assert messages[-1]["role"] == "user" and "write about rain" in str(messages[-1]["content"])


def test_a_preset_sets_model_instructions_and_temperature(
    models_app: tuple[AppServer, ModelsEndpoint, ModelsEndpoint, int],
    open_page: Callable[..., Page],
) -> None:
    server, _, beta, _ = models_app
    page = open_page(server)
    page.goto("/")
    page.get_by_label("Preset", exact=True).select_option("Telegram")
    expect(picker(page)).to_have_value("beta/b-chat")  # the preset's model, shown at once
    asked = len(beta.requests)
    message_box(page).fill("status report")
    button(page, "Send").click()
    expect(page).to_have_url(re.compile(r"/chats/[0-9a-f]{32}$"))
    wait_status(page, "completed")
    assert len(beta.requests) == asked + 1
    request = beta.requests[-1]
    assert request["model"] == "b-chat" and request["temperature"] == 0.3
    assert request["messages"][0] == {"role": "system", "content": PRESET_INSTRUCTIONS}
    expect(picker(page)).to_have_value("beta/b-chat")
    open_chat_options(page)
    expect(page.get_by_label("Instructions", exact=True)).to_have_value(PRESET_INSTRUCTIONS)


def test_a_dead_endpoint_leaves_the_app_working_and_refresh_finds_it_back(
    models_app: tuple[AppServer, ModelsEndpoint, ModelsEndpoint, int],
    open_page: Callable[..., Page],
) -> None:
    server, _, _, dead_port = models_app
    page = open_page(server)
    page.goto("/")
    page.get_by_role("link", name="Tools", exact=True).click()  # the sidebar's
    section = page.get_by_role("region", name="Models", exact=True)
    dead = section.locator("[data-endpoint=dead]")
    expect(dead).to_have_attribute("data-state", "failed")
    expect(dead.locator(".endpoint-error")).to_contain_text(f"127.0.0.1:{dead_port}")
    expect(section.locator("[data-endpoint=alpha]")).to_contain_text("alpha/a-large")
    # The app works on: a chat on a live endpoint answers.
    open_new_chat(page)
    choose(page, "alpha/a-small")
    send_and_wait(page, "still here?")
    # The endpoint comes back where the config says it is; Refresh asks again.
    revived = ModelsEndpoint(name="dead", models=["d-back"], port=dead_port)
    revived.start()
    try:
        page.goto(server.base_url + "/tools")
        with page.expect_response(lambda r: r.url.endswith("/tools/models/refresh")):
            button(page, "Refresh").click()
        expect(dead).to_have_attribute("data-state", "ready")
        expect(dead).to_contain_text("dead/d-back")
        open_new_chat(page)
        expect(picker(page).locator("option", has_text="dead/d-back")).to_have_count(1)
    finally:
        revived.stop()


def test_screenshots_of_two_models_presets_and_the_more_menu(
    models_app: tuple[AppServer, ModelsEndpoint, ModelsEndpoint, int],
    open_page: Callable[..., Page],
) -> None:
    """For a human to look at (artifacts/screenshots/models-*): a reply in two versions by
    two models, the new-chat page's Preset and Model, the open More menu, Chat options'
    Instructions and the Models section; at 375 px nothing may widen the page."""
    server, _, _, _ = models_app
    setup = open_page(server)
    chat_url = open_new_chat(setup)
    choose(setup, "alpha/a-large")
    send_and_wait(setup, "Which model are you?")
    choose(setup, "beta/b-chat")
    regenerate_button(replies(setup).first).click()
    expect_version(replies(setup).first, 2, 2)
    wait_status(setup, "completed", index=0)
    SHOTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        for size_name, viewport in SIZES.items():
            name = f"models-{scheme}-{size_name}"
            page = open_page(server, color_scheme=scheme, viewport=viewport)
            page.goto(chat_url)
            expect(replies(page).first).to_have_attribute("data-model", "beta/b-chat")
            open_chat_options(page)
            page.screenshot(path=str(SHOTS / f"{name}-chat.png"))
            page.goto("/")
            page.get_by_label("Preset", exact=True).select_option("Telegram")
            page.get_by_text("More", exact=True).click()
            expect(button(page, "Import")).to_be_visible()
            page.screenshot(path=str(SHOTS / f"{name}-new-chat.png"))
            page.goto("/tools")
            expect(page.locator("[data-endpoint=dead]")).to_have_attribute("data-state", "failed")
            page.screenshot(path=str(SHOTS / f"{name}-models.png"))
            overflow = page.evaluate("() => document.documentElement.scrollWidth - innerWidth")
            assert overflow <= 0, f"{name}: the page is {overflow}px too wide"
            for part in ("chat", "new-chat", "models"):
                assert (SHOTS / f"{name}-{part}.png").stat().st_size > 5_000
