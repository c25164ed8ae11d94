"""The Markdown cache is bounded in bytes, not in entries (SPEC §17)."""

from __future__ import annotations

import sys

from webapp.web import markdown
from webapp.web.byte_cache import ByteBoundedCache


def test_the_cache_holds_at_most_its_bytes_and_drops_the_least_recently_used():
    computed: list[str] = []

    def upper(text: str) -> str:
        computed.append(text)
        return text.upper()

    cache = ByteBoundedCache(upper, max_bytes=4_000)
    texts = [f"{i:04d}" + "x" * 300 for i in range(20)]
    for text in texts:
        assert cache(text) == text.upper()
    assert cache.size <= 4_000 and 0 < len(cache) < 20
    assert cache.size == sum(
        sys.getsizeof(t) + sys.getsizeof(t.upper()) for t in texts[-len(cache) :]
    )
    computed.clear()
    cache(texts[-1])  # kept: not computed again
    cache(texts[0])  # dropped long ago: computed again
    assert computed == [texts[0]]
    assert cache("y" * 5_000) == "Y" * 5_000 and "y" * 5_000 not in computed[:-1]
    assert cache.size <= 4_000  # too big to keep: computed, returned, not cached


def test_the_markdown_cache_stays_within_its_bytes_whatever_it_renders():
    markdown._render.cache_clear()
    big = "word " * 19_000  # ~95,000 characters: 1,024 of these held ~200 MB before
    for i in range(200):
        markdown.render_markdown(f"{i} {big}")
    assert markdown._render.size <= markdown.MARKDOWN_CACHE_BYTES
    assert len(markdown._render) < 200
    markdown._render.cache_clear()
