"""Replies render Markdown: highlighted code with a working Copy button, safe links."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from .ui import REPLY, button, open_new_chat, send_and_wait

CODE = 'def greet(name: str) -> str:\n    return f"Hello, {name}!"'
MESSAGE = f"Please look at [the docs](https://example.com/docs) and this:\n\n```python\n{CODE}\n```"


def test_code_block_is_highlighted_and_copy_puts_the_code_on_the_clipboard(page: Page) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    open_new_chat(page)
    send_and_wait(page, MESSAGE)
    reply = page.locator(REPLY).last
    code = reply.locator("pre code").filter(has_text="def greet").first
    expect(code).to_be_visible()
    # Highlighting: the code is split into styled tokens, not one plain text node.
    assert code.locator("span[class]").count() > 3, code.inner_html()
    block = reply.locator("pre").filter(has_text="def greet").first.locator("xpath=..")
    button(block, "Copy").click()
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert copied.strip() == CODE, f"clipboard holds {copied!r}"


def test_links_in_replies_are_kept_safe(page: Page) -> None:
    open_new_chat(page)
    send_and_wait(page, MESSAGE)
    link = page.locator(REPLY).last.get_by_role("link", name="the docs")
    expect(link).to_have_attribute("href", "https://example.com/docs")
    rel = link.get_attribute("rel") or ""
    assert "noopener" in rel.split() and "noreferrer" in rel.split(), f"rel={rel!r}"
