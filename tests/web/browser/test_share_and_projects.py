"""SPEC §15 in a real Chromium: share links in each --share-links mode under --auth
password (with Continue this chat), and projects whose instructions and files reach a
real endpoint on loopback (it records each request), with chats moved in and out by the
Project select."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect

from .harness import AppFactory, AppServer, FakeEndpoint, numbered_reply
from .test_accounts import PASSWORD, _add_user
from .test_axe import expect_no_violations
from .ui import button, message_box, open_chat_options, open_new_chat, send_and_wait, users

NOTES = b"The gate code is PLUM-42.\nWater the plums on Sundays.\n"


def _sign_in(page: Page, name: str) -> None:
    page.goto("/login")
    page.get_by_label("User name").fill(name)
    page.get_by_label("Password").fill(PASSWORD)
    button(page, "Sign in").click()
    expect(page).to_have_url(re.compile(r"/$"))


def _share(page: Page) -> str:
    page.get_by_role("link", name="Share", exact=True).click()
    button(page, "Create link").click()
    box = page.get_by_label("Share link", exact=True)
    expect(box).to_have_attribute("readonly", "")
    expect(button(page, "Copy link")).to_be_visible()
    found = re.search(r"(/s/[A-Za-z0-9_-]{43})$", box.input_value())
    assert found, box.input_value()
    expect_no_violations(page, "the share page")
    return found.group(1)


def _no_controls(page: Page) -> None:
    expect(page.locator("[data-role=user]").first).to_be_visible()
    expect(message_box(page)).to_have_count(0)
    for name in ("Send", "Edit", "Regenerate", "Branch", "Stop", "Continue", "Delete chat"):
        expect(button(page, name)).to_have_count(0)
    expect(page.get_by_text("Chat options")).to_have_count(0)
    expect(page.locator("meta[name=robots]")).to_have_attribute("content", "noindex, nofollow")


def test_each_share_mode_under_password_sign_in(
    start_app: AppFactory, open_page: Callable[..., Page], tmp_path: Path
) -> None:
    _add_user(tmp_path / "chat.db", "alice")
    _add_user(tmp_path / "chat.db", "bob")
    server = start_app("--auth", "password")  # signed-in, the default
    alice = open_page(server)
    _sign_in(alice, "alice")
    chat = "/" + open_new_chat(alice).split("/", 3)[3]  # a path: the port changes below
    send_and_wait(alice, "count to 3")
    path = _share(alice)
    alice.goto(chat)
    send_and_wait(alice, "count to 4")  # after the link: not in it until Update

    bob = open_page(server)
    _sign_in(bob, "bob")
    response = bob.goto(path)
    assert response is not None
    assert response.headers["x-robots-tag"] == "noindex"
    assert response.headers["referrer-policy"] == "no-referrer"
    _no_controls(bob)
    expect(bob.locator("[data-role=user]")).to_have_count(1)
    expect_no_violations(bob, "a shared page")
    alice.goto(chat + "/share")
    button(alice, "Update link").click()
    bob.reload()
    expect(bob.locator("[data-role=user]")).to_have_count(2)
    alice.goto(chat)
    nav = alice.get_by_role("navigation", name="Chats", exact=True)
    expect(nav.get_by_role("link")).to_contain_text(["Shared"])

    # Continue this chat: Bob's own chat holding the shared path, opened.
    button(bob, "Continue this chat").click()
    button(bob, "Continue this chat").click()  # the confirm step
    expect(bob).to_have_url(re.compile(r"/chats/[0-9a-f]{32}$"))
    expect(users(bob)).to_have_count(2)
    send_and_wait(bob, "count to 2")
    expect(users(bob)).to_have_count(3)
    alice.goto(chat)
    expect(users(alice)).to_have_count(2)  # the original is unchanged

    nobody = open_page(server)
    nobody.goto(path)
    expect(nobody).to_have_url(re.compile(r"/login\?next=/s/"))
    server.stop()

    server = start_app("--auth", "password", "--share-links", "anyone")
    nobody = open_page(server)
    nobody.goto(path)
    _no_controls(nobody)
    expect(button(nobody, "Continue this chat")).to_have_count(0)
    server.stop()

    server = start_app("--auth", "password", "--share-links", "off")
    alice = open_page(server)
    _sign_in(alice, "alice")
    alice.goto(chat)
    expect(message_box(alice)).to_be_visible()
    expect(alice.get_by_role("link", name="Share", exact=True)).to_have_count(0)
    response = alice.goto(path)
    assert response is not None and response.status == 404


def test_project_instructions_reach_the_model_and_chats_move(
    start_app: AppFactory,
    open_page: Callable[..., Page],
    fake_endpoint: Callable[[str], FakeEndpoint],
) -> None:
    endpoint = fake_endpoint("numbered")
    page = open_page(start_app("--base-url", endpoint.base_url, "--model", "test"))
    page.goto("/")
    page.get_by_label("Project name", exact=True).fill("Travel")
    button(page, "New project").click()
    expect(page).to_have_url(re.compile(r"/projects/[0-9a-f]{32}$"))
    project = page.url
    projects = page.get_by_role("navigation", name="Projects", exact=True)
    expect(projects.get_by_role("link")).to_have_text(["Travel"])
    page.get_by_label("Instructions", exact=True).fill("Answer in French.")
    button(page, "Save instructions").click()
    expect(page.get_by_label("Instructions", exact=True)).to_have_value("Answer in French.")
    page.get_by_label("Attach files", exact=True).set_input_files(
        files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": NOTES}]
    )
    button(page, "Add files").click()
    files = page.get_by_role("list", name="Files of this project")
    expect(files.locator("[data-role=attachment]")).to_have_attribute("data-name", "notes.txt")
    expect_no_violations(page, "a project's page")

    button(page, "New chat in project").click()
    expect(page).to_have_url(re.compile(r"/chats/[0-9a-f]{32}$"))
    chat = page.url
    menu = open_chat_options(page)
    menu.get_by_label("Instructions", exact=True).fill("Be brief.")
    button(menu, "Save instructions").click()
    reply = send_and_wait(page, "Where to go?")
    assert reply.text.strip() == numbered_reply(1)
    system = endpoint.requests[-1]["messages"][0]
    assert system["role"] == "system"
    # The project's instructions, the chat's own, then the project's files.
    assert system["content"].startswith("Answer in French.\n\nBe brief.\n\nProject files:")
    assert "[notes.txt]\nThe gate code is PLUM-42." in system["content"]

    # Out of the project with the select (it saves itself), then the model hears only
    # the chat's own instructions.
    page.goto(chat)
    menu = open_chat_options(page)
    with page.expect_navigation():  # the select posts its form itself
        menu.get_by_label("Project", exact=True).select_option(label="No project")
    expect(page).to_have_url(chat)
    page.goto(project)
    expect(
        page.get_by_role("list", name="Chats in this project").get_by_role("link")
    ).to_have_count(0)
    page.goto(chat)
    send_and_wait(page, "And then?")
    assert endpoint.requests[-1]["messages"][0]["content"] == "Be brief."  # no files either

    # In again, and the project deleted: the chat stays, outside any project.
    menu = open_chat_options(page)
    with page.expect_navigation():
        menu.get_by_label("Project", exact=True).select_option(label="Travel")
    page.goto(project)
    chats = page.get_by_role("list", name="Chats in this project").get_by_role("link")
    expect(chats).to_have_count(1)
    page.get_by_label("Name of the project").fill("Holidays")
    button(page, "Rename project").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Holidays")
    button(page, "Delete project").click()
    expect(
        page.get_by_role("navigation", name="Projects", exact=True).get_by_role("link")
    ).to_have_count(0)
    page.goto(chat)
    expect(users(page)).to_have_count(2)


def test_without_javascript_move_puts_a_chat_in_a_project_and_share_works(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(app, java_script_enabled=False)
    page.goto("/")
    page.get_by_label("Project name", exact=True).fill("Offline")
    button(page, "New project").click()
    project = page.url
    page.goto("/")
    button(page, "New chat").click()
    expect(page).to_have_url(re.compile(r"/chats/[0-9a-f]{32}$"))
    chat = page.url
    page.get_by_text("Chat options", exact=True).click()
    page.get_by_label("Project", exact=True).select_option(label="Offline")
    button(page, "Move").click()
    expect(page).to_have_url(chat)
    expect(page.get_by_label("Project", exact=True)).to_have_value(project.rsplit("/", 1)[1])
    page.goto(project)
    chats = page.get_by_role("list", name="Chats in this project").get_by_role("link")
    expect(chats).to_have_count(1)
    page.goto(chat)
    page.get_by_role("link", name="Share", exact=True).click()
    button(page, "Create link").click()
    expect(page.get_by_label("Share link", exact=True)).to_have_value(re.compile(r"/s/"))
    button(page, "Revoke link").click()
    expect(button(page, "Create link")).to_be_visible()
