"""Streamed text fragments: escaped text in a span, exactly as markupsafe escapes it."""

from __future__ import annotations

from markupsafe import escape

from webapp.web.fragments import Fragments


def test_streamed_text_is_escaped_exactly_as_markupsafe_escapes_it():
    for text in ["plain", " w42", "<script>alert('x')</script>", 'a & "b"', "x\ny", "é 😀", ""]:
        assert Fragments.text(text) == f"<span>{escape(text)}</span>"
