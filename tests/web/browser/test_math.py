"""Math in a reply is MathML laid out by the browser, with JavaScript or without it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playwright.sync_api import Page, expect

from .harness import AppServer
from .ui import REPLY, open_new_chat, send_and_wait

PHONE = {"width": 375, "height": 740}
LONG_SUM = " + ".join(f"a_{{{i}}}" for i in range(1, 41))
# The offline model answers a message it does not recognise by quoting it, so the
# math comes back in the reply, the only place Markdown (and so math) is rendered.
# It quotes at most 500 characters; this stays under that.
MESSAGE = (
    "A fraction:\n\n$$\\frac{a}{b}$$\n\nand a square $x^2$ in a sentence.\n\n"
    f"A long sum:\n\n$$ {LONG_SUM} $$"
)

# Where the browser put things: MathML that is laid out stacks the numerator over
# the denominator and raises the exponent; as plain text they would sit on one line.
_LAYOUT_JS = """
reply => {
  const box = el => el.getBoundingClientRect();
  const math = Array.from(reply.querySelectorAll('math'));
  const [num, den] = Array.from(reply.querySelector('mfrac').children).map(box);
  const [base, exp] = Array.from(reply.querySelector('msup').children).map(box);
  const wide = math[math.length - 1];
  const wideBox = box(wide);
  wide.scrollLeft = wide.scrollWidth;  // only a scroll container moves
  return {
    namespaces: math.map(m => m.namespaceURI),
    displays: math.map(m => m.getAttribute('display')),
    stacked: num.bottom <= den.top + 1,
    raised: exp.top < base.top,
    wideScrolls: wide.scrollWidth > wide.clientWidth && wide.scrollLeft > 0,
    wideRight: wideBox.right,
    contentRight: box(wide.closest('.content')).right,
    viewport: window.innerWidth,
  };
}
"""


def assert_math_laid_out(page: Page) -> None:
    reply = page.locator(REPLY).last
    expect(reply.locator('math[display="block"]')).to_have_count(2)
    layout: dict[str, Any] = reply.evaluate(_LAYOUT_JS)
    assert layout["namespaces"] == ["http://www.w3.org/1998/Math/MathML"] * 3, layout
    assert layout["displays"] == ["block", "inline", "block"], layout
    assert layout["stacked"] and layout["raised"], layout
    # On a phone the long sum scrolls inside itself, within the reply and the screen.
    # (The page's own width is not checked here: that is the layout's business.)
    assert layout["wideScrolls"], layout
    assert layout["wideRight"] <= layout["contentRight"] + 1, layout
    assert layout["contentRight"] <= layout["viewport"] == PHONE["width"], layout


def test_math_in_a_reply_is_mathml_with_and_without_javascript(
    app: AppServer, open_page: Callable[..., Page]
) -> None:
    page = open_page(app, viewport=PHONE)
    chat_url = open_new_chat(page)
    send_and_wait(page, MESSAGE)
    assert_math_laid_out(page)
    # The server's HTML alone carries the math: reload the chat with scripts off.
    still = open_page(app, viewport=PHONE, java_script_enabled=False)
    still.goto(chat_url)
    assert_math_laid_out(still)
