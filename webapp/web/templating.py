"""Jinja2 set-up: autoescaped templates; `url_for`, Markdown and the SSE event names everywhere.

Fragments are rendered outside any request too (a run's events are rendered
once, by the run's own task, and sent to every client), so `url_for` here
builds paths from the app's routes without needing a request.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jinja2
from starlette.responses import HTMLResponse
from starlette.routing import BaseRoute, NoMatchFound

from webapp.web import event_names
from webapp.web.markdown import render_markdown

UrlFor = Callable[..., str]


class Templates:
    """Renders templates by name; one instance per app."""

    def __init__(self, directory: str | os.PathLike[str], url_for: UrlFor) -> None:
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(os.fspath(directory)),
            autoescape=True,
            undefined=jinja2.StrictUndefined,  # a missing variable is a bug, not blank text
            trim_blocks=True,
            lstrip_blocks=True,
            # The templates do not change while the app runs: without this every
            # render, and every include inside a loop, asks the disk for a file's age.
            auto_reload=False,
        )
        self.env.globals["url_for"] = _remembered(url_for)
        self.env.globals["events"] = event_names
        self.env.filters["markdown"] = render_markdown
        self.env.filters["clock"] = _clock

    def render(self, name: str, **context: Any) -> str:
        return self.env.get_template(name).render(**context)

    def response(
        self,
        name: str,
        *,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        **context: Any,
    ) -> HTMLResponse:
        return HTMLResponse(
            self.render(name, **context), status_code=status_code, headers=dict(headers or {})
        )


def _clock(moment: float) -> str:
    """A time of today as the server's clock reads it, e.g. 14:05:09."""
    return time.strftime("%H:%M:%S", time.localtime(moment))


def by_name(routes: Sequence[BaseRoute]) -> UrlFor:
    """Starlette's ``url_path_for`` over ``routes``, going straight to the routes of
    that name: Starlette's own tries every route in turn, each failing with an
    exception until the one named, and every reply's new run ids miss the cache."""
    named: dict[str, list[BaseRoute]] = {}
    for route in routes:
        named.setdefault(getattr(route, "name", None) or "", []).append(route)

    def url_for(name: str, /, **params: Any) -> str:
        for route in named.get(name, ()):
            try:
                return str(route.url_path_for(name, **params))
            except NoMatchFound:
                continue
        raise NoMatchFound(name, params)

    return url_for


def _remembered(url_for: UrlFor, size: int = 8192) -> UrlFor:
    """``url_for`` with its answers kept: a page draws the same few paths dozens of
    times, and each call walks the route table (the routes never change once built)."""
    cached = functools.lru_cache(maxsize=size)(url_for)

    def remembered(name: str, /, **params: Any) -> str:
        try:
            return cached(name, **params)  # type: ignore[no-any-return]
        except TypeError:  # an unhashable parameter: ask the routes directly
            return url_for(name, **params)

    return remembered
