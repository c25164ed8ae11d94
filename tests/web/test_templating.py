"""Templates: the ``url_for`` they see answers as the routes do, however often it is asked."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.routing import NoMatchFound

from webapp.web import create_app


def test_url_for_in_templates_answers_as_the_routes_do(tmp_path: Path):
    app = create_app(tmp_path / "chat.db")
    url_for = app.state.web.templates.env.globals["url_for"]
    for _ in range(3):  # asked again: the same answer
        assert url_for("chat", chat_id="abc") == app.url_path_for("chat", chat_id="abc")
        assert url_for("chat", chat_id="def") == "/chats/def"
        assert url_for("static", path="app.css") == app.url_path_for("static", path="app.css")
    with pytest.raises(NoMatchFound):
        url_for("no-such-route")
    with pytest.raises(NoMatchFound):  # an unhashable parameter still reaches the routes
        url_for("chat", chat_id=["a"], extra=["b"])


def test_url_for_finds_every_route_by_its_name_as_starlette_does(tmp_path: Path):
    app = create_app(tmp_path / "chat.db")
    url_for = app.state.web.templates.env.globals["url_for"]
    named = [r for r in app.routes if getattr(r, "name", None)]
    assert len(named) > 15
    for route in named:
        params = {key: f"x{i}" for i, key in enumerate(route.param_convertors)}  # type: ignore[attr-defined]
        if route.name == "static":
            params = {"path": "app.js"}
        fresh = {key: value + "-new" for key, value in params.items()}  # not in any cache
        assert url_for(route.name, **fresh) == app.url_path_for(route.name, **fresh), route.name
    with pytest.raises(NoMatchFound):  # the right name with the wrong parameters
        url_for("events", chat_id="abc")
