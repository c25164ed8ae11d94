"""Math never paints outside its reply (issue 22): hostile offsets and sizes in Chromium.

Two layers are checked, each able to fail alone. The server bounds what a formula
may do (offsets summed down the tree, sizes multiplied), so the boxes the browser
lays out stay near the text; the stylesheet clips whatever still leaves the reply's
content, so what is painted stays inside the reply. Ordinary math is neither
clipped nor changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playwright.sync_api import Locator, Page

from .harness import REPO_ROOT, AppServer
from .ui import REPLY, open_new_chat, replies, send_and_wait

SHOTS = REPO_ROOT / "artifacts" / "screenshots"
DESKTOP = {"width": 1280, "height": 900}
# The offline model quotes a message it does not recognise, so each of these comes
# back as math inside a reply (none has arithmetic the calculator would take).
RAISED = (
    r"Raised: $\raise{19em}{\raise{19em}{\text{SPOOFED TEXT}}}$ and lowered: "
    r"$\lower{19em}{\lower{19em}{\text{SUNK TEXT}}}$"
)
HUGE = "Huge: $" + r"\Huge" * 10 + r" X$ and ${\Huge{\Huge{\Huge{\Huge Y}}}}$"
SPACED = (
    r"Spaced: $a\hspace{19em}b\kern{19em}c\hspace{9em}d$, $\moveleft{19em}{\text{LEFT}}$, "
    r"$\raise{4em}{\raise{4em}{\raise{4em}{\text{UP}}}}$ and ${\Huge\raise{3em}{\Huge Z}}$"
)
ORDINARY = (
    r"Ordinary: $$\frac{a}{b} + \sum_{i=1}^{n} i^2$$ and "
    r"$\begin{pmatrix} a & b \\ c & d \end{pmatrix}$, $\int_0^\infty e^{-x^2}\,dx$ "
    r"and $\Bigl( \frac{x}{y} \Bigr)$"
)
# Each message, and a piece of its math's text that selecting the reply must copy. The
# ordinary one goes first, so that the hostile replies have earlier messages to cover.
MESSAGES = {
    "ordinary": (ORDINARY, "\N{N-ARY SUMMATION}"),
    "raised": (RAISED, "SPOOFED TEXT"),
    "huge": (HUGE, "\N{MATHEMATICAL ITALIC CAPITAL X}"),
    "spaced": (SPACED, "UP"),
}
# The server's room, in em of the reply's font (webapp/web/markdown.py).
MAX_SCALE, VERTICAL_EM, HORIZONTAL_EM = 4.0, 5.0, 10.0
SLACK_PX = 0.5  # sub-pixel rounding of rectangles

# Every box inside the reply's math as laid out ("raw") and as painted: the raw box
# cut by each ancestor up to the reply that clips (overflow other than visible, or
# paint containment), at its padding box.
_BOXES_JS = """
reply => {
  const rect = b => ({left: b.left, top: b.top, right: b.right, bottom: b.bottom});
  const clipOf = el => {
    const c = {left: -Infinity, top: -Infinity, right: Infinity, bottom: Infinity};
    for (let a = el.parentElement; a; a = a.parentElement) {
      const s = getComputedStyle(a);
      const paint = /paint|strict|content/.test(s.contain);
      const b = a.getBoundingClientRect();
      const left = b.left + a.clientLeft, top = b.top + a.clientTop;
      if (paint || s.overflowX !== 'visible') {
        c.left = Math.max(c.left, left); c.right = Math.min(c.right, left + a.clientWidth);
      }
      if (paint || s.overflowY !== 'visible') {
        c.top = Math.max(c.top, top); c.bottom = Math.min(c.bottom, top + a.clientHeight);
      }
      if (a === reply) break;
    }
    return c;
  };
  const boxes = [];
  let largestFont = 0;
  for (const el of reply.querySelectorAll('math, math *')) {
    largestFont = Math.max(largestFont, parseFloat(getComputedStyle(el).fontSize));
    const b = el.getBoundingClientRect();
    if (b.width === 0 || b.height === 0) continue;  // paints nothing itself
    const c = clipOf(el);
    const p = {left: Math.max(b.left, c.left), top: Math.max(b.top, c.top),
               right: Math.min(b.right, c.right), bottom: Math.min(b.bottom, c.bottom)};
    const shown = p.left < p.right && p.top < p.bottom;
    boxes.push({tag: el.tagName, text: el.textContent.slice(0, 24),
                raw: rect(b), painted: shown ? p : null});
  }
  const content = reply.querySelector(':scope > .content');
  const selection = getSelection();
  selection.selectAllChildren(content);
  const selected = selection.toString();
  selection.removeAllRanges();
  // Every other message, in the same scroll position as the boxes.
  const others = Array.from(document.querySelectorAll('[data-role]'))
    .map((e, i) => ({index: i, box: rect(e.getBoundingClientRect()), self: e === reply}))
    .filter(o => !o.self);
  return {reply: rect(reply.getBoundingClientRect()), boxes, largestFont, selected, others,
          font: parseFloat(getComputedStyle(content).fontSize)};
}
"""


def _inside(box: dict[str, float], outer: dict[str, float], slack: float = SLACK_PX) -> bool:
    return (
        box["left"] >= outer["left"] - slack
        and box["top"] >= outer["top"] - slack
        and box["right"] <= outer["right"] + slack
        and box["bottom"] <= outer["bottom"] + slack
    )


def _overlaps(box: dict[str, float], other: dict[str, float]) -> bool:
    return (
        min(box["right"], other["right"]) - max(box["left"], other["left"]) > SLACK_PX
        and min(box["bottom"], other["bottom"]) - max(box["top"], other["top"]) > SLACK_PX
    )


def _widened(outer: dict[str, float], dx: float, dy: float) -> dict[str, float]:
    return {
        "left": outer["left"] - dx,
        "top": outer["top"] - dy,
        "right": outer["right"] + dx,
        "bottom": outer["bottom"] + dy,
    }


def _unchanged_without(reply: Locator, neighbour: Locator) -> bool:
    """Whether `neighbour` looks the same with `reply` hidden: nothing of it paints there."""
    shown = neighbour.screenshot()
    reply.evaluate("e => { e.style.visibility = 'hidden'; }")
    try:
        hidden = neighbour.screenshot()
    finally:
        reply.evaluate("e => { e.style.visibility = ''; }")
    return shown == hidden


def _shoot(page: Page, name: str, reply: Locator) -> None:
    """A 1280 px screenshot with the top of `reply` 400 px down, under the messages before it."""
    reply.evaluate(
        "e => e.closest('.conversation').scrollBy(0, e.getBoundingClientRect().top - 400)"
    )
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"math-contained-{name}.png"))


def _check_reply(page: Page, name: str, index: int, text: str) -> list[str]:
    """What is wrong with reply `index` (empty when it keeps its math to itself)."""
    reply = replies(page).nth(index)
    found: dict[str, Any] = reply.evaluate(_BOXES_JS)
    box, font = found["reply"], found["font"]
    problems = []
    painted = [b for b in found["boxes"] if b["painted"] is not None]
    outside = [b for b in painted if not _inside(b["painted"], box)]
    if outside:
        problems.append(
            f"{name}: {len(outside)} math boxes paint outside the reply {box}: {outside[:3]}"
        )
    # The server's bounds, seen in the layout itself: nothing is pushed further than
    # the room it allows, and no font is larger than it allows.
    room = _widened(box, HORIZONTAL_EM * font, VERTICAL_EM * font)
    far = [b for b in found["boxes"] if not _inside(b["raw"], room)]
    if far:
        problems.append(f"{name}: {len(far)} math boxes laid out far outside the reply: {far[:3]}")
    if found["largestFont"] > MAX_SCALE * font + SLACK_PX:
        problems.append(f"{name}: a {found['largestFont']}px font in a {font}px reply")
    if box["bottom"] - box["top"] >= 1_000:
        problems.append(f"{name}: the reply is {box['bottom'] - box['top']:.0f}px tall")
    # Ink stays within the boxes laid out, so only a message that one of them reaches
    # can be painted over; those are compared pixel for pixel with the reply hidden.
    messages = page.locator("[data-role]")
    for other in found["others"]:
        if any(_overlaps(b["painted"], other["box"]) for b in painted):
            problems.append(f"{name}: the reply's math overlaps message {other['index']}")
        if any(_overlaps(b["raw"], other["box"]) for b in found["boxes"]) and not (
            _unchanged_without(reply, messages.nth(other["index"]))
        ):
            problems.append(f"{name}: the reply paints over message {other['index']}")
    # The clip changes nothing for selection: the formulas' text is still copied.
    if text not in found["selected"].replace("\N{NO-BREAK SPACE}", " "):
        problems.append(f"{name}: selecting the reply does not copy {text!r}")
    if name == "ordinary":
        clipped = [b for b in found["boxes"] if b["painted"] != b["raw"]]
        if clipped:
            problems.append(f"ordinary math is clipped: {clipped[:3]}")
    return problems


def test_math_stays_inside_its_reply(app: AppServer, open_page: Callable[..., Page]) -> None:
    page = open_page(app, viewport=DESKTOP)
    open_new_chat(page)
    for message, _ in MESSAGES.values():
        send_and_wait(page, message)
    assert page.locator(f"{REPLY} math").count() >= 10
    for index, name in enumerate(MESSAGES):
        _shoot(page, name, replies(page).nth(index))
    problems: list[str] = []
    for index, (name, (_, text)) in enumerate(MESSAGES.items()):
        problems += _check_reply(page, name, index, text)
    assert not problems, "\n".join(problems)
