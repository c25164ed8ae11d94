"""SPEC §13 in a real Chromium: sign in, chat, sign out, with --auth password."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect

from .harness import REPO_ROOT, AppFactory
from .ui import button, message_box, open_new_chat, send_and_wait

PASSWORD = "a long enough password"


def _add_user(db: Path, name: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEBAPP_", "OPENAI_"))}
    env["PYTHONPATH"] = str(REPO_ROOT)
    subprocess.run(
        [sys.executable, "-m", "webapp", "users", "add", name, "--password-stdin", "--db", str(db)],
        input=PASSWORD,
        text=True,
        check=True,
        capture_output=True,
        timeout=60,
        env=env,
    )


def test_sign_in_chat_and_sign_out(
    start_app: AppFactory, open_page: Callable[..., Page], tmp_path: Path
) -> None:
    _add_user(tmp_path / "chat.db", "alice")
    page = open_page(start_app("--auth", "password"))
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login\?next=/$"))
    page.get_by_label("User name").fill("alice")
    page.get_by_label("Password").fill("not the password")
    button(page, "Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("Wrong user name or password.")
    expect(page.get_by_label("User name")).to_have_value("alice")  # kept; the password not
    expect(page.get_by_label("Password")).to_have_value("")
    page.get_by_label("Password").fill(PASSWORD)
    button(page, "Sign in").click()
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.locator(".sidebar .account")).to_contain_text("Signed in as alice")

    chat = open_new_chat(page)
    reply = send_and_wait(page, "count to 5")
    assert reply.text.split() == ["1", "2", "3", "4", "5"]
    cookie = next(c for c in page.context.cookies() if c["name"] == "webapp_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"

    button(page, "Sign out").click()
    expect(page).to_have_url(re.compile(r"/login$"))
    assert not [c for c in page.context.cookies() if c["name"] == "webapp_session"]
    page.goto(chat)  # the chat is behind the sign-in page again
    expect(page).to_have_url(re.compile(r"/login\?next=/chats/"))
    expect(message_box(page)).to_have_count(0)
