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
