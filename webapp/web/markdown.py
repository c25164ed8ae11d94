"""Markdown to safe HTML, with code blocks highlighted and math typeset on the server.

User and model text are untrusted. Safety rests on four choices, each
named for the attack it stops:
- raw HTML is off (``html=False``): ``<script>`` or ``<img onerror>`` in a
  message is shown as text, never parsed as markup;
- links are validated against an allow-list of schemes (http, https, mailto,
  and scheme-less relative links): ``javascript:`` and ``data:`` links render
  as plain text;
- images are disabled: the CSP only allows same-origin images, and a remote
  image would be a tracking beacon anyway, so ``![x](url)`` is shown as the
  link ``[x](url)``, without the ``!``;
- math is re-serialised from the converter's element tree, never taken as
  the converter's string: that string un-escapes text, so ``\\text{<script>}``
  would come out as a real tag, and ``\\href``, ``\\style`` and ``\\class`` would
  carry attributes. Only allow-listed MathML elements and attributes survive,
  and every text is escaped; their sizes and offsets are bounded along each path
  of the tree, so nested ``\\raise`` or ``\\Huge`` cannot draw over an earlier
  message or make a reply thousands of pixels tall (the stylesheet clips what
  still leaves the reply).
Every link gets ``rel="noopener noreferrer nofollow"``. Math needs no script
(MathML is laid out by the browser), and a formula that cannot be converted,
or would cost too much, is shown as code, never as an error.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from xml.etree.ElementTree import Element

from latex2mathml.converter import convert_to_element
from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.rules_block import StateBlock
from markdown_it.rules_inline import StateInline
from markdown_it.rules_inline import link as link_rule
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from markupsafe import Markup, escape
from mdit_py_plugins.dollarmath import dollarmath_plugin
from mdit_py_plugins.dollarmath.index import math_inline_dollar
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from webapp.web.byte_cache import ByteBoundedCache

_SAFE_SCHEMES = ("http", "https", "mailto")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*):")
# Browsers ignore these inside a URL before the scheme ("java\tscript:" works).
_IGNORED_IN_URL = re.compile(r"[\x00-\x20\x7f]")
_FORMATTER = HtmlFormatter(nowrap=True)
_LANG = re.compile(r"^[A-Za-z0-9_+#.\-]{1,40}$")


def _validate_link(url: str) -> bool:
    """Only http(s), mailto and relative links survive; the rest become text."""
    compact = _IGNORED_IN_URL.sub("", url)
    found = _SCHEME.match(compact)
    if found is None:
        # "//host/path" is protocol-relative and fine; a colon before any slash
        # that the regex missed would be an odd scheme, so refuse it.
        head = compact.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
        return ":" not in head
    return found.group(1).lower() in _SAFE_SCHEMES


def _highlight(code: str, lang: str) -> str:
    """A highlighted code block with a copy button; ``lang`` is untrusted."""
    name = lang.strip().split()[0] if lang.strip() else ""
    lexer = None
    if name and _LANG.match(name):
        try:
            lexer = get_lexer_by_name(name)
        except ClassNotFound:
            lexer = None
    body = highlight(code, lexer, _FORMATTER) if lexer is not None else str(escape(code))
    label = escape(name) if lexer is not None else ""
    return (
        '<div class="codeblock">'
        f'<div class="codebar"><span class="lang">{label}</span>'
        '<button type="button" class="copy" data-copy-code>Copy</button></div>'
        f'<pre class="highlight"><code>{body}</code></pre></div>\n'
    )


def _render_link_open(
    self: RendererHTML, tokens: list[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    tokens[idx].attrSet("rel", "noopener noreferrer nofollow")
    return self.renderToken(tokens, idx, options, env)


def _fence(
    self: RendererHTML, tokens: list[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    return _highlight(token.content, token.info)


def _code_block(
    self: RendererHTML, tokens: list[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    return _highlight(tokens[idx].content, "")


# --- Math ---------------------------------------------------------------------
#
# Finding math: mdit-py-plugins' dollarmath for $..$ and $$..$$. It honours
# backslash-escaped dollars, leaves code spans and blocks alone (they are parsed
# first), and with the settings in _build() leaves prices as text: no space just
# inside the dollars and no digit just outside them, the rule pandoc uses, so
# "$5 and $10" is not math (nor, a rule of ours, "US$5"). Its own digit check
# reads the character before a "$" at the very start of a paragraph as the
# paragraph's LAST character ("$x$ is 4" would not be math), so the digit check
# is done here instead (_dollar_rule).
# texmath's "brackets" mode is not used for \(..\) and \[..\]: it only finds \[ at
# the start of a block, drops any text after the closing \] on that line, and its
# tokens collide with dollarmath's names; two small rules below do it instead.
#
# Converting: latex2mathml, pure Python, to MathML that browsers lay out without
# any script. Its string output is unsafe (see the module docstring), so the
# element tree is written out by _write_mathml.

# One formula, in characters: the converter is roughly quadratic on some
# malformed input (~50 ms at this size); longer is shown as code.
_MATH_MAX_CHARS = 2_000
# All formulas of one message: past this, the rest are shown as code, so a page
# render stays well under a second whatever a reply holds.
_MATH_BUDGET_CHARS = 20_000
_MATH_BUDGET_KEY = "math_chars"
# Macros can expand far beyond the source's length; a chat reply has no need of them.
_MACRO_DEFINITION = re.compile(
    r"\\(?:[gex]?def|let|(?:re)?newcommand|providecommand|(?:re)?newenvironment"
    r"|DeclareMathOperator)(?![A-Za-z])"
)
# latex2mathml passes a command it does not know through as text ("<mi>\ce</mi>"):
# that is a failed conversion too, shown as code rather than half-typeset.
_COMMAND = re.compile(r"\\[A-Za-z]+")
# MathML Core presentation elements. Anything else the converter emits becomes an
# <mrow> around its (filtered) children, so no element can carry a link or script.
_MATH_ELEMENTS = frozenset({
    "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "msup", "msub", "msubsup", "mfrac",
    "msqrt", "mroot", "mstyle", "mpadded", "mphantom", "mover", "munder", "munderover",
    "mmultiscripts", "mprescripts", "none", "mtable", "mtr", "mtd", "menclose", "merror",
})  # fmt: skip
# Layout attributes only: no href, style, class, id or on*; and no mathcolor or
# mathbackground, which ignore the dark theme and could hide text.
_MATH_ATTRIBUTES = frozenset({
    "mathvariant", "stretchy", "fence", "separator", "lspace", "rspace", "accent",
    "accentunder", "form", "largeop", "movablelimits", "symmetric", "minsize", "maxsize",
    "mathsize", "displaystyle", "scriptlevel", "linethickness", "width", "height", "depth",
    "voffset", "notation", "columnalign", "rowalign", "columnlines", "rowlines",
    "columnspacing", "rowspacing", "frame", "framespacing", "columnspan", "rowspan",
    "linebreak", "align", "equalrows", "equalcolumns",
})  # fmt: skip
_MATH_VALUE = re.compile(r"[A-Za-z0-9 .+%-]{1,64}")
_NUMBER = re.compile(r"\d*\.?\d+")
# Each attribute can be sane alone and still compound with its ancestors': sizes
# multiply down the tree (ten nested \Huge make a letter 9,000 times larger) and
# offsets add up (\raise inside \raise lifts text over the message before the reply).
# So the writer carries, down each path of the tree, how large the font may be there
# and how much room for offsets is left, in em of the reply's own font, and drops an
# attribute that would go past either (the element is then laid out without it).
_MATH_MAX_SCALE = 4.0  # \Huge alone is 2.49; \Huge\Huge would be 6.2
_MATH_MIN_SCALE = 0.25  # \tiny is 0.5; smaller is unreadable
_MATH_MAX_VERTICAL_EM = 5.0  # \Bigg is 2.47em; a strut or \raise rarely 1em
_MATH_MAX_HORIZONTAL_EM = 10.0  # \qquad is 2em, \hspace{3cm} 7em
# Lengths that move or size something, and the direction they do it in.
_VERTICAL, _HORIZONTAL = ("vertical",), ("horizontal",)
_MATH_LENGTHS = {
    "voffset": _VERTICAL, "height": _VERTICAL, "depth": _VERTICAL, "minsize": _VERTICAL,
    "maxsize": _VERTICAL, "linethickness": _VERTICAL, "rowspacing": _VERTICAL,
    "width": _HORIZONTAL, "lspace": _HORIZONTAL, "rspace": _HORIZONTAL,
    "columnspacing": _HORIZONTAL, "framespacing": _VERTICAL + _HORIZONTAL,
}  # fmt: skip
_LENGTH = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([a-z]*)")
# Em per unit; the font-relative ones scale with the font size where they stand.
_RELATIVE_EM = {"em": 1.0, "ex": 0.5, "mu": 1 / 18}
_ABSOLUTE_EM = {"px": 1 / 16, "pt": 1 / 12, "pc": 1.0, "in": 6.0, "cm": 6 / 2.54, "mm": 0.6 / 2.54}
# MathML 3's named spaces, from 1/18em to 7/18em (browsers now ignore them).
_NAMED_SPACE = re.compile(r"(?:negative)?(?:very){0,2}(?:thin|medium|thick)mathspace")
_SIZE = re.compile(r"(\d+\.?\d*|\.\d+)(em|%)")
# TeX's three sizes (\displaystyle and \textstyle, \scriptstyle, \scriptscriptstyle).
# A relative "-3" would enlarge the text by 0.71^-3 for each element carrying it.
_SCRIPT_LEVELS = frozenset({"0", "1", "2"})
# The browser sets these children a script level smaller (MathML Core's user agent
# stylesheet); an element there that sets its own mathsize skips that step, and a
# \displaystyle inside it then enlarges the text by 1/0.71 (about 1.41) per level.
_SCRIPTED = frozenset({"msub", "msup", "msubsup", "mmultiscripts", "munder", "mover", "munderover"})
_SCRIPT_GROWTH = 1.5  # 1/0.71 rounded up: fonts shrink scripts to 70-71%
# Elements deep. Real formulas stay far below (a ten-level continued fraction is
# about 30); the converter can nest nearly a thousand, which a browser's parser
# would flatten and a recursive writer would choke on.
_MATH_MAX_DEPTH = 64
# Any other number above this is dropped (a rowspan of 99999 would be a huge table);
# lengths and sizes are bounded by _Room below.
_MATH_MAX_LENGTH = 20.0
_CLOSERS = {"$": "$", "$$": "$$", "\\(": "\\)", "\\[": "\\]"}
_MATH_ERROR_TITLE = "This formula could not be typeset"


def _dollar_rule() -> Callable[[StateInline, bool], bool]:
    """dollarmath's inline rule, refusing a "$" with a digit just outside it.

    A letter before the opening "$" refuses it too: "US$5", "A$20" are prices.
    """
    find = math_inline_dollar(allow_space=False, allow_digits=True, allow_double=True)

    def rule(state: StateInline, silent: bool) -> bool:
        src, start = state.src, state.pos
        if src[start] != "$" or (start > 0 and src[start - 1].isalnum()):
            return False
        if not find(state, True):
            return False
        end, state.pos = state.pos, start
        if end > state.posMax or (end < len(src) and src[end].isdigit()):
            return False
        if silent:
            state.pos = end
            return True
        return find(state, False)

    return rule


def _find_closer(text: str, start: int, closer: str, stop: int) -> int:
    r"""Index of the first ``closer`` (``\)`` or ``\]``) in text[start:stop] not
    preceded by an odd run of backslashes (``\\)`` is a line break, then ")"); -1 if none."""
    found = text.find(closer, start, stop)
    while found >= 0:
        before = found
        while before > start and text[before - 1] == "\\":
            before -= 1
        if (found - before) % 2 == 0:
            return found
        found = text.find(closer, found + 1, stop)
    return -1


def _bracket_inline(state: StateInline, silent: bool) -> bool:
    r"""``\(..\)`` inline and ``\[..\]`` display math anywhere in a paragraph.

    It runs before the "escape" rule, which would otherwise read ``\(`` as an
    escaped parenthesis. A closer further than _MATH_MAX_CHARS away is not looked
    for (the scan stays linear), so such an opener is plain text.
    """
    src, start = state.src, state.pos
    if src[start] != "\\" or start + 1 >= state.posMax or src[start + 1] not in "([":
        return False
    opener = src[start : start + 2]
    stop = min(state.posMax, start + 2 + _MATH_MAX_CHARS + 2)
    end = _find_closer(src, start + 2, _CLOSERS[opener], stop)
    if end < 0 or not src[start + 2 : end].strip():
        return False
    if not silent:
        token = state.push("math_inline" if opener == "\\(" else "math_inline_double", "math", 0)
        token.content = src[start + 2 : end]
        token.markup = opener
    state.pos = end + 2
    return True


def _bracket_block(state: StateBlock, start_line: int, end_line: int, silent: bool) -> bool:
    r"""``\[..\]`` opening a block, over one or more lines up to a line ending in ``\]``.

    Like dollarmath's ``$$`` block, it keeps lines such as "+ b" inside the formula
    instead of letting them start a list; text after the closing ``\]`` leaves the
    whole thing to the paragraph (and _bracket_inline).
    """
    if state.is_code_block(start_line):
        return False
    begin = state.bMarks[start_line] + state.tShift[start_line]
    if not state.src.startswith("\\[", begin):
        return False
    parts: list[str] = []
    line, pos, length = start_line, begin + 2, 0
    while line < end_line:
        text = state.src[pos : state.eMarks[line]]
        if line > start_line and (state.isEmpty(line) or state.sCount[line] < state.blkIndent):
            return False
        length += len(text) + 1
        if length > _MATH_MAX_CHARS + 4:  # as in _bracket_inline: keep the scan short
            return False
        close = _find_closer(text, 0, "\\]", len(text))
        if close >= 0:
            if text[close + 2 :].strip():
                return False
            parts.append(text[:close])
            break
        parts.append(text)
        line += 1
        if line < end_line:
            pos = state.bMarks[line] + state.tShift[line]
    else:  # no line ends the formula
        return False
    if silent:
        return True
    state.line = line + 1
    token = state.push("math_block", "math", 0)
    token.block = True
    token.content = "\n".join(parts)
    token.markup = "\\["
    token.map = [start_line, state.line]
    return True


@dataclass(frozen=True)
class _Room:
    """What an element's attributes may still do, in em of the reply's font size."""

    scale: float = 1.0  # the largest the font can be here
    sizes: float = 1.0  # the product of the mathsize factors down to here
    vertical: float = _MATH_MAX_VERTICAL_EM
    horizontal: float = _MATH_MAX_HORIZONTAL_EM


def _script_steps(parent: str, index: int) -> int:
    """How many script levels smaller the browser makes the child at ``index``."""
    if parent == "mroot" and index == 1:
        return 2
    return 1 if parent == "mfrac" or (parent in _SCRIPTED and index > 0) else 0


def _length_em(value: str, scale: float) -> float | None:
    """The largest length in ``value`` (one, or a list for tables) in em of the reply's
    font; None for anything else: a percentage or MathML 3's "1width" would be relative
    to the content's own size, which cannot be bounded here (browsers ignore them)."""
    largest = 0.0
    for part in value.lower().split():
        found = _LENGTH.fullmatch(part)
        if _NAMED_SPACE.fullmatch(part):
            amount = 7 / 18 * scale
        elif found is None:
            return None
        elif found.group(2) in _RELATIVE_EM:
            amount = float(found.group(1)) * _RELATIVE_EM[found.group(2)] * scale
        elif found.group(2) in _ABSOLUTE_EM:
            amount = float(found.group(1)) * _ABSOLUTE_EM[found.group(2)]
        elif found.group(2) == "" and float(found.group(1)) == 0:
            amount = 0.0
        else:
            return None
        largest = max(largest, amount)
    return largest


def _resized(room: _Room, attributes: dict[str, str], steps: int) -> _Room:
    """``room`` inside an element with these attributes; removes from ``attributes`` a
    mathsize that would make the font too large or too small there, and a scriptlevel
    that is not one of TeX's three."""
    level = attributes.get("scriptlevel")
    if level is not None and level not in _SCRIPT_LEVELS:
        del attributes["scriptlevel"]
    elif level is not None:
        steps += int(level)  # what a mathsize on the same element would skip too
    size = attributes.get("mathsize")
    if size is None:
        return room
    found = _SIZE.fullmatch(size.lower())
    factor = float(found.group(1)) / (100 if found.group(2) == "%" else 1) if found else 0.0
    scale = room.scale * factor * _SCRIPT_GROWTH**steps
    sizes = room.sizes * factor
    if sizes < _MATH_MIN_SCALE or scale > _MATH_MAX_SCALE:
        del attributes["mathsize"]
        return room
    return replace(room, scale=scale, sizes=sizes)


def _math_attributes(element: Element, room: _Room, steps: int) -> tuple[str, _Room]:
    """The element's allow-listed attributes, and the room left for its children."""
    attributes = {
        name: value
        for name, value in element.attrib.items()
        if name in _MATH_ATTRIBUTES and _MATH_VALUE.fullmatch(value)
    }
    room = _resized(room, attributes, steps)
    kept = []
    stretch = 0.0  # minsize and maxsize bound the same extent: only the larger counts
    for name, value in attributes.items():
        axes = _MATH_LENGTHS.get(name)
        if axes is not None:
            amount = _length_em(value, room.scale)
            if amount is None:
                continue
            cost = max(0.0, amount - stretch) if name in ("minsize", "maxsize") else amount
            if any(cost > getattr(room, axis) for axis in axes):
                continue
            if name in ("minsize", "maxsize"):
                stretch = max(stretch, amount)
            room = replace(room, **{axis: getattr(room, axis) - cost for axis in axes})
        elif name != "mathsize" and any(
            float(number) > _MATH_MAX_LENGTH for number in _NUMBER.findall(value)
        ):
            continue
        kept.append(f' {name}="{escape(value)}"')
    return "".join(kept), room


def _write_mathml(
    element: Element, out: list[str], room: _Room, depth: int = 1, steps: int = 0
) -> None:
    """Append ``element`` as allow-listed MathML with every text escaped.

    The converter stores characters as references ("&#x0211D;") in its text and
    leaves the user's text raw, so text is unescaped once and escaped again.
    ``room`` is what is left to the element from its ancestors, ``steps`` the script
    levels its parent takes it down.
    """
    if depth > _MATH_MAX_DEPTH:
        raise ValueError(f"formula nested more than {_MATH_MAX_DEPTH} elements deep")
    tag = element.tag if element.tag in _MATH_ELEMENTS else "mrow"
    attributes, inner = _math_attributes(element, room, steps)
    out.append(f"<{tag}{attributes}>")
    if element.text:
        text = html.unescape(element.text)
        if tag != "mtext" and _COMMAND.fullmatch(text):
            raise ValueError(f"latex2mathml does not know the command {text}")
        out.append(str(escape(text)))
    for index, child in enumerate(element):
        _write_mathml(child, out, inner, depth + 1, _script_steps(tag, index))
    out.append(f"</{tag}>")
    if element.tail:
        out.append(str(escape(html.unescape(element.tail))))


@functools.lru_cache(maxsize=256)
def _to_mathml(latex: str, display: bool) -> str | None:
    """Safe MathML for ``latex``; None if it cannot be converted (pages re-render
    every reply on each load, hence the cache)."""
    if len(latex) > _MATH_MAX_CHARS or _MACRO_DEFINITION.search(latex):
        return None
    mode = "block" if display else "inline"
    out = [f'<math display="{mode}">']
    try:
        for child in convert_to_element(latex, display=mode):
            _write_mathml(child, out, _Room())
    except Exception:  # noqa: BLE001 -- any failure means "show the source instead"
        # Malformed LaTeX surfaces as many exception types: latex2mathml's own,
        # StopIteration, IndexError, RecursionError for deep nesting...
        return None
    out.append("</math>")
    return "".join(out)


def _render_math(
    self: RendererHTML, tokens: list[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    """MathML for a math token, or its source as code when that cannot be had."""
    token = tokens[idx]
    latex = token.content.strip()
    # Counted even when cached, so a message renders the same on every load.
    spent = env.get(_MATH_BUDGET_KEY, 0) + len(latex)
    env[_MATH_BUDGET_KEY] = spent
    display = token.type != "math_inline"
    mathml = _to_mathml(latex, display) if spent <= _MATH_BUDGET_CHARS else None
    if mathml is None:
        source = escape(token.markup + token.content + _CLOSERS.get(token.markup, ""))
        shown = f'<code class="math-error" title="{_MATH_ERROR_TITLE}">{source}</code>'
        return f"<p>{shown}</p>\n" if token.block else shown
    return mathml + "\n" if token.block else mathml


def _image_as_link(state: StateInline, silent: bool) -> bool:
    """``![alt](url)`` as the link ``[alt](url)``: the ``!`` goes with the image."""
    start = state.pos
    if state.src[start : start + 2] != "![":
        return False
    state.pos = start + 1
    if link_rule(state, silent):
        return True
    state.pos = start  # not a link after all: the "!" stays text
    return False


def _build() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.disable("image")
    md.inline.ruler.before("link", "image_as_link", _image_as_link)
    md.validateLink = _validate_link  # type: ignore[method-assign]
    md.add_render_rule("link_open", _render_link_open)
    md.add_render_rule("fence", _fence)
    md.add_render_rule("code_block", _code_block)
    # Labels ("$$x$$ (eq1)") would add anchors, and a blank line inside $$..$$ would
    # let one stray "$$" swallow the paragraphs after it.
    dollarmath_plugin(md, allow_labels=False, allow_blank_lines=False, double_inline=True)
    md.inline.ruler.at("math_inline", _dollar_rule())
    md.inline.ruler.before("escape", "math_bracket", _bracket_inline)
    md.block.ruler.after("math_block", "math_block_bracket", _bracket_block)
    for kind in ("math_inline", "math_inline_double", "math_block"):
        md.add_render_rule(kind, _render_math)
    return md


_MD = _build()


def render_markdown(text: str) -> Markup:
    """Safe HTML for a message's Markdown."""
    return Markup(_render(text))


def _render_uncached(text: str) -> str:
    return _MD.render(text)


# A finished reply's text never changes, and every page view renders the same replies
# again: the same text always gives the same HTML, so keep the latest -- 16 MB of them.
MARKDOWN_CACHE_BYTES = 16 * 1024 * 1024
_render = ByteBoundedCache(_render_uncached, MARKDOWN_CACHE_BYTES)


def pygments_css(light: str = "default", dark: str = "monokai") -> str:
    """The stylesheet for highlighted code, light and dark (static/pygments.css)."""
    light_css = HtmlFormatter(style=light).get_style_defs(".highlight")
    dark_css = HtmlFormatter(style=dark).get_style_defs(".highlight")
    indented = "\n".join("  " + line for line in dark_css.splitlines())
    return (
        "/* Generated by webapp.web.markdown.pygments_css(); do not edit by hand. */\n"
        f"{light_css}\n@media (prefers-color-scheme: dark) {{\n{indented}\n}}\n"
    )
