"""Math in replies: LaTeX becomes MathML on the server, prices and code stay text.

Every check parses the rendered HTML; the hostile inputs check the whole tree,
so an element or attribute outside the allow-list fails wherever it appears.
"""

from __future__ import annotations

from collections.abc import Iterator
from xml.etree.ElementTree import Element, SubElement

import pytest
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
    """Conversions are cached per process; a test that swaps the converter must not leak."""
    markdown_module._to_mathml.cache_clear()
    yield
    markdown_module._to_mathml.cache_clear()


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
