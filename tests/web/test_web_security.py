"""Safety: token (401), cross-origin refusal (403), CSP headers, inert hostile Markdown."""

from __future__ import annotations

from pathlib import Path

import httpx
from starlette.requests import Request
from starlette.responses import Response
from webhelpers import MakeClient, parse_html, replies

from webapp.chats.users import EVERY_CHAT
from webapp.models import ScriptedModel
from webapp.web import create_app
from webapp.web.markdown import render_markdown
from webapp.web.security import CSP, SECURITY_HEADERS

TOKEN = "s3cret-token-value"

HOSTILE = """<script>window.__pwned=1</script>
<img src=x onerror="window.__pwned=1">
[click](javascript:window.__pwned=1) [tab](java\tscript:alert(1)) [data](data:text/html,x)
[vb](VBScript:msgbox) ![pic](http://evil.example/t.png) <b>raw bold</b>
<a href="http://evil.example" onclick="x()">link</a>
```html
<script>alert(1)</script>
```
[ok](https://example.com/a?b=1) [rel](/chats) [mail](mailto:a@example.com)
"""


def assert_inert(root) -> None:  # type: ignore[no-untyped-def]
    """No script, no event handler, no dangerous link, no raw tag from the text."""
    for node in root.iter():
        assert node.tag not in ("script", "img", "iframe", "b", "object", "embed"), node.tag
        assert not any(name.startswith("on") for name in node.attrs), node.attrs
        if node.tag == "a":
            href = (node.attrs.get("href") or "").strip().lower()
            assert href.startswith(("http:", "https:", "mailto:", "/")), href
            assert node.attrs["rel"] == "noopener noreferrer nofollow"


def test_hostile_markdown_is_inert_and_visible_as_text():
    root = parse_html(str(render_markdown(HOSTILE)))
    assert_inert(root)
    text = root.text()
    assert "<script>window.__pwned=1</script>" in text
    assert "<b>raw bold</b>" in text
    assert "[click](javascript:window.__pwned=1)" in text
    hrefs = [a.attrs["href"] for a in root.find_all("a")]
    assert hrefs == [
        "http://evil.example/t.png",  # an image becomes a plain link (no remote images)
        "https://example.com/a?b=1",
        "/chats",
        "mailto:a@example.com",
    ]


def test_an_image_is_shown_as_its_link_without_the_bang():
    root = parse_html(str(render_markdown("See ![a cat](https://example.com/c.png) here.")))
    assert root.find_all("img") == []
    [link] = root.find_all("a")
    assert link.attrs["href"] == "https://example.com/c.png"
    assert root.text().strip() == "See a cat here."
    # a "!" that starts no link stays, and so does one escaped before a link
    assert parse_html(str(render_markdown("Wow! ![not a link"))).text().strip() == (
        "Wow! ![not a link"
    )
    assert parse_html(str(render_markdown("\\![x](/y)"))).text().strip() == "!x"


def test_code_blocks_are_highlighted_with_a_copy_button():
    root = parse_html(str(render_markdown("```python\nprint('<hi>')\n```")))
    block = root.find(class_="codeblock")
    assert block.find(class_="lang").text() == "python"
    assert block.find("button").norm_text() == "Copy"
    code = block.find("code")
    assert code.text() == "print('<hi>')\n"
    assert code.find_all("span", class_="nb")  # Pygments token classes
    # An unknown or hostile language name is not trusted.
    odd = parse_html(str(render_markdown('```"><script>\nx\n```')))
    assert odd.find(class_="lang").text() == ""
    assert_inert(odd)


async def test_hostile_user_and_model_text_render_inert(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([HOSTILE]))
    chat_id = await client.new_chat()
    await client.send(chat_id, HOSTILE)
    await client.wait_idle(chat_id)
    response = await client.http.get(f"/chats/{chat_id}")
    page = parse_html(response.text)
    for message in page.find_all(data_role=True):
        assert_inert(message)
    assert all(s.attrs.get("src") for s in page.find_all("script"))  # no inline script
    assert not [n for n in page.iter() if "style" in n.attrs]  # CSP: no inline styles
    user = page.find(data_role="user").find(class_="content").text()
    assert user == HOSTILE.replace("\r\n", "\n")
    reply = replies(page)[0]
    assert "<script>window.__pwned=1</script>" in reply.find(class_="content").text()
    # The title (from the first message) is escaped text too.
    assert "<script>" in page.find("title").text()


async def test_security_headers_on_every_response(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]))
    chat_id = await client.new_chat()
    for path in ("/", f"/chats/{chat_id}", "/static/app.js", "/chats/unknown"):
        response = await client.http.get(path)
        assert response.headers["content-security-policy"] == CSP, path
        assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "same-origin"
    page = parse_html((await client.http.get(f"/chats/{chat_id}")).text)
    config = page.find("meta", name="htmx-config").attrs["content"] or ""
    assert '"includeIndicatorStyles": false' in config  # htmx must not inject <style>
    # htmx must not copy style attributes while settling (the CSP would refuse them).
    assert '"attributesToSettle": ["class", "width", "height"]' in config
    icon = page.find("link", rel="icon").attrs["href"] or ""
    assert (await client.http.get(icon)).status_code == 200


async def test_cross_origin_posts_are_403(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel(["ok"]))
    chat_id = await client.new_chat()
    url = f"/chats/{chat_id}/messages"
    evil = await client.http.post(url, data={"text": "hi"}, headers={"Origin": "http://evil.test"})
    assert evil.status_code == 403
    assert "another site" in parse_html(evil.text).find(role="alert").norm_text()
    evil_ref = await client.http.post(
        url, data={"text": "hi"}, headers={"Referer": "http://evil.test/page"}
    )
    assert evil_ref.status_code == 403
    null = await client.http.post(url, data={"text": "hi"}, headers={"Origin": "null"})
    assert null.status_code == 403
    for path in (f"/chats/{chat_id}/delete", "/chats", f"/chats/{chat_id}/rename"):
        response = await client.http.post(path, headers={"Origin": "http://evil.test"})
        assert response.status_code == 403, path
    assert await client.web.chats.get(EVERY_CHAT, chat_id) is not None
    assert await client.web.session.segments(chat_id) == []
    same = await client.http.post(url, data={"text": "hi"}, headers={"Origin": "http://testserver"})
    assert same.status_code == 303
    same_ref = await client.http.get(f"/chats/{chat_id}", headers={"Origin": "http://evil.test"})
    assert same_ref.status_code == 200  # reading is not a state change
    await client.wait_idle(chat_id)


async def test_token_is_required_and_set_as_a_strict_cookie(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]), token=TOKEN)
    for path in ("/", "/static/app.js", "/chats/x"):
        response = await client.http.get(path)
        assert response.status_code == 401, path
        assert "token" in parse_html(response.text).find(role="alert").norm_text()
    assert (await client.http.post("/chats")).status_code == 401
    assert (await client.http.get("/?token=wrong-token-value")).status_code == 401
    response = await client.http.get("/?token=" + TOKEN)
    assert response.status_code == 303
    assert response.headers["location"] == "/"  # the token leaves the address bar
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"webapp_token={TOKEN};")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    # httpx keeps the cookie: from now on the app answers.
    assert (await client.http.get("/")).status_code == 200
    chat_id = await client.new_chat()
    assert (await client.http.get(f"/chats/{chat_id}")).status_code == 200
    client.http.cookies.clear()
    assert (await client.http.get(f"/chats/{chat_id}")).status_code == 401


async def test_other_host_names_are_refused_when_hosts_are_pinned(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]), allowed_hosts=["testserver"])
    assert (await client.http.get("/")).status_code == 200
    # DNS rebinding: a foreign name pointed at this server, "same origin" with itself.
    rebound = {"Host": "evil.example:8000", "Origin": "http://evil.example:8000"}
    assert (await client.http.get("/", headers={"Host": "evil.example"})).status_code == 400
    assert (await client.http.post("/chats", headers=rebound)).status_code == 400
    assert await client.web.chats.recent(EVERY_CHAT) == []


async def test_streamed_text_is_escaped_before_the_final_markdown(web_client_factory: MakeClient):
    from webhelpers import parse_sse

    client = await web_client_factory(model=ScriptedModel([HOSTILE]))
    chat_id = await client.new_chat()
    await client.send(chat_id, "hi")
    await client.wait_idle(chat_id)
    state = client.web.runs.latest(chat_id)
    assert state is not None
    response = await client.http.get(
        f"/chats/{chat_id}/runs/{state.run_id}/events",
        headers={"Last-Event-ID": f"{state.epoch}:0"},
    )
    events = parse_sse(response.text)
    deltas = [parse_html(e.data) for e in events if e.event == "text"]
    assert "".join(d.text() for d in deltas) == HOSTILE
    for delta in deltas:
        assert {n.tag for n in delta.iter()} == {"span"}  # text only, in plain spans
    final = parse_html(events[-1].data)
    assert events[-1].event == "done"
    assert_inert(final.find(data_role="assistant"))


async def test_a_server_error_is_our_page_with_the_security_headers(tmp_path: Path):
    app = create_app(tmp_path / "chat.db", model=ScriptedModel([]))

    async def boom(request: Request) -> Response:
        raise RuntimeError("secret internals in the traceback")

    app.add_route("/boom", boom)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://testserver") as http,
    ):
        response = await http.get("/boom")
    assert response.status_code == 500
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get(name) == value, name
    assert "secret internals" not in response.text and "Traceback" not in response.text
    assert "went wrong" in parse_html(response.text).find(role="alert").norm_text()


async def test_the_token_redirect_stays_on_this_site(web_client_factory: MakeClient):
    client = await web_client_factory(model=ScriptedModel([]), token=TOKEN)
    cases = {  # path as sent -> redirect target (escapes kept as sent)
        "//evil.example/": "/evil.example/",
        "/%2F%2Fevil.example": "/%2F%2Fevil.example",
        "/%2f/evil.example": "/%2f/evil.example",
        "/\\evil.example/x": "/evil.example/x",
        "/\\/\\evil.example": "/evil.example",
        "/chats/a%20b": "/chats/a%20b",
    }
    for path, target in cases.items():
        response = await client.http.get(f"http://testserver{path}?token={TOKEN}&q=1")
        assert response.status_code == 303, path
        assert response.headers["location"] == f"{target}?q=1", path


async def test_a_foreign_host_is_refused_with_a_token(web_client_factory: MakeClient):
    client = await web_client_factory(
        model=ScriptedModel([]), token=TOKEN, allowed_hosts=["testserver"]
    )
    response = await client.http.get(f"/?token={TOKEN}", headers={"Host": "evil.example"})
    assert response.status_code == 400
    assert "location" not in response.headers and "set-cookie" not in response.headers
    assert (await client.http.get(f"/?token={TOKEN}")).status_code == 303
