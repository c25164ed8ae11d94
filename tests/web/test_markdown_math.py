"""Math in replies: LaTeX becomes MathML on the server, prices and code stay text.

Every check parses the rendered HTML; the hostile inputs check the whole tree,
so an element or attribute outside the allow-list fails wherever it appears.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from xml.etree.ElementTree import Element, SubElement

import pytest
from latex2mathml.converter import convert_to_element
from webhelpers import Node, parse_html

import webapp.web.markdown as markdown_module
from webapp.web.markdown import render_markdown

MATHML_ELEMENTS = {
    "math", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "msup", "msub", "msubsup",
    "mfrac", "msqrt", "mroot", "mstyle", "mpadded", "mphantom", "mover", "munder",
    "munderover", "mmultiscripts", "mprescripts", "none", "mtable", "mtr", "mtd", "menclose",
    "merror",
}  # fmt: skip
SAFE_ATTRIBUTES = {
    "display", "mathvariant", "stretchy", "fence", "separator", "lspace", "rspace", "accent",
    "accentunder", "form", "largeop", "movablelimits", "symmetric", "minsize", "maxsize",
    "mathsize", "displaystyle", "scriptlevel", "linethickness", "width", "height", "depth",
    "voffset", "notation", "columnalign", "rowalign", "columnlines", "rowlines",
    "columnspacing", "rowspacing", "frame", "framespacing", "columnspan", "rowspan",
    "linebreak", "align", "equalrows", "equalcolumns",
}  # fmt: skip


def render(text: str) -> Node:
    return parse_html(str(render_markdown(text)))


def maths(root: Node) -> list[Node]:
    return root.find_all("math")


def errors(root: Node) -> list[Node]:
    return root.find_all("code", class_="math-error")


def only_math(root: Node) -> Node:
    found = maths(root)
    assert len(found) == 1, f"expected one <math>, found {len(found)}"
    return found[0]


def is_inline(math: Node) -> bool:
    return math.attrs.get("display", "inline") == "inline"


def assert_only_safe_mathml(root: Node) -> None:
    """Inside every <math>: allow-listed MathML elements and attributes, nothing else."""
    for math in maths(root):
        for node in [math, *math.iter()]:
            assert node.tag in MATHML_ELEMENTS, f"<{node.tag}> inside <math>"
            unexpected = set(node.attrs) - SAFE_ATTRIBUTES
            assert not unexpected, f"<{node.tag}> carries {unexpected}"


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    """Conversions and pages are cached per process; a test that swaps the converter
    must not leak, nor see another's result."""
    for cache in (markdown_module._to_mathml, markdown_module._render):
        cache.cache_clear()
    yield
    for cache in (markdown_module._to_mathml, markdown_module._render):
        cache.cache_clear()


# --- what becomes math ---------------------------------------------------------------


def test_dollar_math_is_inline_mathml_with_the_right_structure():
    root = render("Area grows as $x^2$ here.")
    math = only_math(root)
    assert is_inline(math)
    sup = math.find("msup")
    base, exponent = [child for child in sup.children if isinstance(child, Node)]
    assert (base.tag, base.text()) == ("mi", "x")
    assert (exponent.tag, exponent.text()) == ("mn", "2")
    paragraph = root.find("p")
    assert math.parent is paragraph
    assert paragraph.norm_text() == "Area grows as x2 here."


def test_paren_math_is_inline():
    root = render(r"Let \(a_1 + b\) be given.")
    math = only_math(root)
    assert is_inline(math)
    assert math.find("msub").find("mn").text() == "1"
    assert root.find("p").norm_text().startswith("Let")


@pytest.mark.parametrize(
    "text",
    [
        r"$$\frac{a}{b}$$",
        "$$\n\\frac{a}{b}\n$$",
        r"Before $$\frac{a}{b}$$ after.",
        "Before\n$$\n\\frac{a}{b}\n$$\nafter.",
        r"\[\frac{a}{b}\]",
        "\\[\n\\frac{a}{b}\n\\]",
        r"Before \[\frac{a}{b}\] after.",
        "- item\n\n  $$\\frac{a}{b}$$",
        "> quoted\n>\n> \\[\n> \\frac{a}{b}\n> \\]",
    ],
    ids=[
        "dollars-alone",
        "dollars-lines",
        "dollars-mid-paragraph",
        "dollars-lines-in-paragraph",
        "brackets-alone",
        "brackets-lines",
        "brackets-mid-paragraph",
        "in-list",
        "in-quote",
    ],
)
def test_display_math_is_block_wherever_it_stands(text: str):
    root = render(text)
    math = only_math(root)
    assert math.attrs.get("display") == "block"
    fraction = math.find("mfrac")
    assert [n.text() for n in fraction.iter() if n.tag == "mi"] == ["a", "b"]
    assert not errors(root)
    if "Before" in text:
        words = root.norm_text()
        assert words.startswith("Before") and words.endswith("after.")


def test_a_display_block_keeps_lines_that_look_like_markdown():
    # "+ b" would start a list if the formula were read as a paragraph.
    root = render("\\[\na\n+ b\n\\]")
    math = only_math(root)
    assert math.attrs.get("display") == "block"
    assert [n.text() for n in math.iter() if n.tag in ("mi", "mo")] == ["a", "+", "b"]
    assert not root.find_all("ul")


def test_math_opening_a_paragraph_that_ends_in_a_digit_is_math():
    # dollarmath's own digit check reads the paragraph's last character here.
    root = render("$x^2$ is 4")
    assert is_inline(only_math(root))
    assert root.norm_text().endswith("is 4")


@pytest.mark.parametrize(
    "latex",
    [
        "x = " + r"1 + \frac{1}{" * 8 + "x" + "}" * 8,  # a continued fraction 8 deep
        r"\begin{pmatrix} a & b \\ c & d \end{pmatrix}",
        r"|x| = \begin{cases} x & x \ge 0 \\ -x & \text{otherwise} \end{cases}",
        r"\sum_{i=1}^{n} i = \frac{n(n+1)}{2}",
        r"\int_0^\infty e^{-x^2}\,dx = \frac{\sqrt{\pi}}{2}",
        r"\lim_{h \to 0} \frac{f(x+h) - f(x)}{h}",
        r"\mathbb{R}^n \ni \vec{v} = \hat{x} + \mathbf{y}",
    ],
)
def test_everyday_formulas_render(latex: str):
    root = render(f"$${latex}$$")
    assert only_math(root).attrs.get("display") == "block"
    assert not errors(root)
    assert_only_safe_mathml(root)


def test_several_formulas_in_one_paragraph():
    root = render(r"If $a=1$ and \(b=2\) then $$a+b=3$$ holds.")
    found = maths(root)
    assert [m.attrs.get("display") for m in found] == ["inline", "inline", "block"]


# --- what stays text -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "It costs $5 and $10.",
        "$5, $10 and $20",
        "Tickets are $5-$10, parking $3.",
        "Between $1,000 and $2,000 a month.",
        "The fee is $5 (it was $6).",
        "I paid $5 for it and $ 10 for that.",
        "US$5 and US$10 are the same as 5$ and 10$.",
        "Lunch was $12\nand dinner $30.",
        "$20 or $30? Maybe $40.",
    ],
)
def test_prices_stay_text(text: str):
    root = render(text)
    assert not maths(root) and not errors(root)
    assert root.norm_text() == " ".join(text.split())


def test_math_next_to_prices_is_still_math():
    root = render("It costs $5, and $x^2$ is a square.")
    math = only_math(root)
    assert math.find("msup")
    assert root.norm_text().startswith("It costs $5, and")


@pytest.mark.parametrize(
    ("text", "literal"),
    [
        (r"An escaped \$x\$ stays.", "An escaped $x$ stays."),
        (r"Escaped \\(x\\) stays.", r"Escaped \(x\) stays."),
        ("A lone $ sign.", "A lone $ sign."),
        ("Empty $$ and $ $ here.", "Empty $$ and $ $ here."),
    ],
)
def test_escaped_or_unpaired_delimiters_stay_text(text: str, literal: str):
    root = render(text)
    assert not maths(root) and not errors(root)
    assert root.norm_text() == literal


@pytest.mark.parametrize(
    "text",
    ["`$x$`", r"`\(x\)`", "`$$x$$`", r"`\[x\]`"],
)
def test_code_spans_are_never_touched(text: str):
    root = render(f"See {text} here.")
    assert not maths(root) and not errors(root)
    assert root.find("code").text() == text.strip("`")


@pytest.mark.parametrize(
    "block",
    [
        "```\n$x$ and \\(x\\)\n$$\ny\n$$\n\\[z\\]\n```",
        "```latex\n$x$ and \\(x\\)\n\\[z\\]\n```",
        "    $x$ and \\(x\\)\n    $$\n    y\n    $$\n    \\[z\\]",
    ],
    ids=["fence", "fence-latex", "indented"],
)
def test_code_blocks_are_never_touched(block: str):
    root = render(f"Code:\n\n{block}\n\nAfter.")
    assert not maths(root) and not errors(root)
    code = root.find("pre").find("code").text()
    assert "$x$ and \\(x\\)" in code and "\\[z\\]" in code


# --- what fails is shown as code -------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        r"$\frac{a}{$",
        r"$$\frac{a}{$$",
        r"\(x^\)",
        r"\[\left( x\]",
        r"$\ce{H2O}$",  # a command latex2mathml does not know
        "$" + "{" * 70 + "x" + "}" * 70 + "$",  # deep nesting
        "$" + "{" * 900 + "x" + "}" * 900 + "$",  # deeper than Python's recursion limit
        "$" + r"\sqrt" * 400 + "x$",
        "$" + "x+" * 1_100 + "x$",  # longer than one formula may be
        r"$\def\a{xx}\def\b{\a\a}\b$",
        r"$\newcommand{\a}{x}\a$",
    ],
    ids=[
        "unclosed-dollar",
        "unclosed-display",
        "missing-superscript",
        "missing-right",
        "unknown-command",
        "deep-braces",
        "deeper-braces",
        "deep-roots",
        "too-long",
        "def",
        "newcommand",
    ],
)
def test_latex_that_fails_to_convert_is_shown_as_code(source: str):
    root = render(f"Before {source} after.")
    assert not maths(root)
    (code,) = errors(root)
    assert code.text() == source
    assert root.norm_text() == f"Before {source} after."


def test_a_failed_display_block_is_code_in_its_own_paragraph():
    root = render("Intro.\n\n$$\n\\frac{a}{\n$$\n\nOutro.")
    (code,) = errors(root)
    assert code.text() == "$$\n\\frac{a}{\n$$"
    assert code.parent is not None and code.parent.tag == "p"
    assert [p.norm_text() for p in root.find_all("p")][::2] == ["Intro.", "Outro."]


def test_hostile_failed_math_is_escaped_code():
    source = r"$\frac{<script>alert(1)</script>}{$"
    root = render(source)
    assert not root.find_all("script")
    assert errors(root)[0].text() == source


def test_math_past_a_messages_budget_is_shown_as_code():
    formula = "$" + "x+" * 499 + "x$"  # 999 characters of LaTeX
    root = render("\n\n".join([formula] * 25))
    assert len(maths(root)) == 20  # 20 x 999 fits in 20,000 characters
    assert len(errors(root)) == 5
    assert errors(root)[0].text() == formula


# --- hostile input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "visible"),
    [
        (r"$\text{<script>alert(1)</script>}$", "<script>alert(1)</script>"),
        (r"\(\text{<img src=x onerror=alert(1)>}\)", "<img src=x onerror=alert(1)>"),
        (r"$\verb|<b>bold</b>|$", "<b>bold</b>"),
        (r'$\text{"><svg onload=alert(1)>}$', '"><svg onload=alert(1)>'),
        (r"$\text{&lt;script&gt;}$", "<script>"),
        (r"$$x \tag{<i>1</i>}$$", "<i>1</i>"),
        (r"$\href{javascript:alert(1)}{x}$", "x"),
        (r"$\style{position:fixed;inset:0}{x}$", "x"),
        (r"$\class{hidden}{x}$", "x"),
        (r"$\color{red}{x}$", "x"),
        (r"$\hspace{99999em}x$", "x"),
    ],
)
def test_hostile_math_renders_inert(source: str, visible: str):
    html = str(render_markdown(source))
    root = parse_html(html)
    math = only_math(root)
    assert_only_safe_mathml(root)
    assert visible in math.text().replace("\N{NO-BREAK SPACE}", " ")
    assert not any(n.tag in ("script", "img", "svg", "b", "i", "a") for n in root.iter())
    assert not any(name in n.attrs for n in root.iter() for name in ("style", "href", "class"))
    widths = [n.attrs.get("width") or "0" for n in root.iter() if "width" in n.attrs]
    assert all(float(width.rstrip("emptx")) <= 20 for width in widths), widths


def test_everything_latex2mathml_emits_is_filtered_through_the_allow_list(
    monkeypatch: pytest.MonkeyPatch,
):
    """Whatever the converter returns, only known MathML with layout attributes is written."""

    def hostile_tree(latex: str, display: str = "inline") -> Element:
        math = Element("math", {"display": display, "onload": "alert(1)"})
        row = SubElement(math, "mrow", {"href": "javascript:alert(1)", "style": "color:red"})
        script = SubElement(row, "script")
        script.text = "alert(1)"
        annotation = SubElement(row, "annotation-xml", {"encoding": "text/html"})
        SubElement(annotation, "mi", {"onclick": "x()", "mathvariant": "bold"}).text = "<b>"
        SubElement(row, "mspace", {"width": "1em", "id": "clobber", "class": "hidden"})
        SubElement(row, "mi", {"mathvariant": 'normal" onmouseover="x()'}).text = "y"
        return math

    monkeypatch.setattr(markdown_module, "convert_to_element", hostile_tree)
    root = render("$anything$")
    math = only_math(root)
    assert_only_safe_mathml(root)
    assert is_inline(math)
    assert [n.tag for n in math.iter()] == ["mrow", "mrow", "mrow", "mi", "mspace", "mi"]
    bold, space, plain = [n for n in math.iter() if n.tag in ("mi", "mspace")]
    assert bold.attrs == {"mathvariant": "bold"} and bold.text() == "<b>"
    assert space.attrs == {"width": "1em"}
    assert plain.attrs == {}  # a value that is not a plain word is dropped
    assert "alert(1)" in math.text()  # the script's text survives only as text


# --- bounds on what a formula draws (issue 22) ------------------------------------------
#
# Each attribute alone was capped, but nested ones compound: \raise inside \raise
# lifted text over the message before the reply, ten \Huge made a reply 6,600 px tall.
# Down every path of the tree the font may grow at most 4 times (or shrink to 1/4),
# and offsets and sizes add up to at most 5em vertically and 10em horizontally, in em
# of the reply's font (test_math_contained.py checks the same in Chromium).

MAX_SCALE, MIN_SCALE, VERTICAL_EM, HORIZONTAL_EM = 4.0, 0.25, 5.0, 10.0
VERTICAL = ("voffset", "height", "depth", "linethickness", "rowspacing")
HORIZONTAL = ("width", "lspace", "rspace", "columnspacing")
EM_PER = {"em": 1.0, "ex": 0.5, "pt": 1 / 12, "px": 1 / 16, "": 0.0}


def em(value: str) -> float:
    """The largest length in an attribute value, in em (these tests only write these units)."""
    lengths = [re.fullmatch(r"[+-]?(\d*\.?\d+)([a-z]*)", part) for part in value.split()]
    assert all(lengths), f"not a length: {value!r}"
    return max(float(m.group(1)) * EM_PER[m.group(2)] for m in lengths if m)


def paths(node: Node, scale: float = 1.0, up: float = 0.0, across: float = 0.0):
    """(font scale, vertical em, horizontal em) at every element, summed from the root."""
    size = node.attrs.get("mathsize")
    if size is not None:
        scale *= float(size[:-1]) / 100 if size.endswith("%") else em(size)
    stretch = max((em(node.attrs[n]) for n in ("minsize", "maxsize") if n in node.attrs), default=0)
    up += scale * (stretch + sum(em(node.attrs[n]) for n in VERTICAL if n in node.attrs))
    across += scale * sum(em(node.attrs[n]) for n in HORIZONTAL if n in node.attrs)
    yield scale, up, across
    for child in node.children:
        if isinstance(child, Node):
            yield from paths(child, scale, up, across)


def assert_bounded(root: Node) -> None:
    for math in maths(root):
        for scale, up, across in paths(math):
            assert MIN_SCALE <= scale <= MAX_SCALE, scale
            assert up <= VERTICAL_EM + 1e-9 and across <= HORIZONTAL_EM + 1e-9, (up, across)


def kept(root: Node, name: str) -> list[str]:
    return [n.attrs[name] or "" for n in only_math(root).iter() if name in n.attrs]


RAISE = r"\raise{%s}{%s}"


@pytest.mark.parametrize(
    "latex",
    [
        RAISE % ("19em", RAISE % ("19em", r"\text{SPOOFED TEXT}")),
        r"\lower{19em}{\lower{19em}{\text{SUNK TEXT}}}",
        "{}".join([r"\raise{1em}{"] * 10) + "x" + "}" * 10,
        r"\raise{2em}{\lower{2em}{\raise{2em}{\lower{2em}{x}}}}",
        r"\raise{1ex}{\raise{30pt}{\raise{40px}{x}}}",
        r"\hspace{19em}\kern{19em}\mkern{300mu}x",
        r"\raise{1em}{\hspace{9em}\raise{1em}{\hspace{9em}x}}",
        r"\raise{4em}{\Bigg( x \Bigg)}",
        r"\Huge\raise{3em}{\Huge\hspace{5em}x}",
        r"\rule{19em}{19em} \rule{4em}{4em}",
        r"\binom{a}{b} \genfrac(]{19em}{0}{a}{b}",
    ],
    ids=[
        "raise-raise",
        "lower-lower",
        "ten-raises",
        "raise-lower",
        "mixed-units",
        "hspace-kern",
        "hspace-in-raises",
        "bigg-in-raise",
        "lengths-in-huge",
        "rules",
        "thick-fraction-line",
    ],
)
def test_offsets_are_summed_down_the_tree_and_bounded(latex: str):
    root = render(f"${latex}$")
    assert not errors(root)
    assert_bounded(root)
    assert_only_safe_mathml(root)


@pytest.mark.parametrize(
    "latex",
    [
        r"\Huge" * 10 + " X",
        r"{\Huge{\Huge{\Huge{\Huge Y}}}}",
        r"\Huge x^{\Huge x^{\Huge x^{\Huge x}}}",
        r"\Huge \frac{\Huge a}{\Huge\displaystyle \frac{\Huge b}{c}}",
        r"\tiny" * 10 + " x",
        r"\Huge\tiny\Huge\tiny\Huge\tiny\Huge x",
    ],
    ids=["ten-huge", "huge-groups", "huge-scripts", "huge-fractions", "ten-tiny", "seesaw"],
)
def test_sizes_are_multiplied_down_the_tree_and_bounded(latex: str):
    root = render(f"${latex}$")
    assert not errors(root)
    assert_bounded(root)


def test_what_fits_is_kept_and_only_what_would_overrun_is_dropped():
    assert kept(render(r"$\Huge\Huge\Huge X$"), "mathsize") == ["2.49em"]
    assert kept(render(r"$\tiny\tiny\tiny x$"), "mathsize") == ["0.5em", "0.5em"]
    assert not kept(render(f"${RAISE % ('19em', RAISE % ('19em', 'x'))}$"), "voffset")
    nested = render(f"${RAISE % ('2em', RAISE % ('2em', 'x'))}$")
    assert kept(nested, "voffset") == ["2em"] and kept(nested, "height") == ["+2em"]
    # Side by side is not nested: spaces next to each other each have the whole room.
    assert kept(render(r"$a\quad b\hspace{9em}c\hspace{9em}d$"), "width") == ["1em", "9em", "9em"]


@pytest.mark.parametrize(
    "latex",
    [
        r"\int_0^1 f(x)\,dx \quad \Bigl( \frac{a}{b} \Bigr) \qquad \big[ x \big]",
        r"\raise{0.5em}{x} \lower{0.3em}{y} \hspace{1cm} \kern3pt z \! w \; v",
        r"\Large A^{\small b} \scriptsize c \displaystyle \sum_{i=1}^{n} i \textstyle \frac12",
        r"\binom{n}{k} \dbinom{n}{k} \begin{smallmatrix} a & b \\ c & d \end{smallmatrix}",
        r"\begin{align} a &= b \\ c &= d \end{align}",
        r"\mathrlap{x} \hphantom{y} \vphantom{\frac{a}{b}} \LaTeX",
        r"\xrightarrow{f} \overset{!}{=} \underbrace{a+b}_{2}",
    ],
)
def test_ordinary_math_keeps_every_attribute_the_converter_gave_it(latex: str):
    """Sizes and spaces real formulas use are written exactly as latex2mathml made them."""
    converted = convert_to_element(latex, display="block")
    expected = [
        {name: value for name, value in element.attrib.items() if name in SAFE_ATTRIBUTES}
        for element in converted.iter()
    ][1:]  # the <math> itself is written by render_markdown
    root = render(f"$${latex}$$")
    assert not errors(root)
    assert [node.attrs for node in only_math(root).iter()] == expected


def test_attributes_no_bound_can_be_put_on_are_dropped(monkeypatch: pytest.MonkeyPatch):
    """A hand-made tree: a relative script level, sizes in units that are not relative to
    the font or are relative to the content ("2width", "900%"), and scripts that set
    their own mathsize, which skips the browser's shrinking of scripts."""

    def tree(latex: str, display: str = "inline") -> Element:
        math = Element("math")
        style = SubElement(math, "mstyle", {"scriptlevel": "-5", "mathsize": "50px"})
        padded = SubElement(style, "mpadded", {"width": "2width", "voffset": "900%"})
        node = SubElement(padded, "mstyle", {"mathsize": "200%"})
        for _ in range(8):
            script = SubElement(node, "msup")
            SubElement(script, "mi").text = "b"
            # Full size where the browser would set it 0.71 times smaller, then back to
            # script level 0: that is 1/0.71 = 1.41 times larger than its parent.
            node = SubElement(SubElement(script, "mstyle", {"mathsize": "1em"}), "mstyle")
            node.set("scriptlevel", "0")
        SubElement(node, "mi").text = "x"
        return math

    monkeypatch.setattr(markdown_module, "convert_to_element", tree)
    root = render("$anything$")
    style, padded, double = list(only_math(root).iter())[:3]
    assert style.attrs == {} and padded.attrs == {}
    assert double.attrs == {"mathsize": "200%"}
    # 2 x 1.41 x 1.41 is 3.98: two such scripts fit in 4 times, a third would not.
    assert 1 + 2 >= len(kept(root, "mathsize")) >= 1
    assert kept(root, "scriptlevel") == ["0"] * 8
