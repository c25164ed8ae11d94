"""SPEC §13 isolation: another person's chat or run id is 404 on every route, and changes nothing.

The attempts are not a list written by hand. Alice makes chats with every kind of
content (versions, a stopped reply, a reply streaming now), then every address
her own pages link to, post to or stream from is collected, with the fields of
each form. Bob, signed in, sends each one -- as it is, as a fragment, and with his
own chat's id and Alice's run ids -- and every route with a chat or run id in its
path is also tried straight from the route table. Each attempt must get 404 and
show nothing of Alice's; afterwards her database rows and pages are as they were.

A route the crawl does not reach, or one not covered here at all, fails the test:
when a route is added, this test says so until it knows how to try it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import httpx
from people import HTML, add_user, new_chat, person, rows
from starlette.applications import Starlette
from starlette.routing import Match, Mount, Route
from webhelpers import HX, MakeClient, Node, WebClient, eventually, parse_html

from webapp.chats.users import Owner
from webapp.web.auth import AuthSettings
from webapp.web.chat_service import ChatNotFound

SECRET = "quokka-7731"
# Routes that name no chat: each is per person, and checked on its own below.
PER_PERSON = {"home", "new_chat", "import_chat", "search", "new_project"}
# Projects, and the shared page a link opens: tried as another person in
# test_isolation_projects.py (the share's own management routes name the chat: here).
PROJECTS_AND_SHARED = {"project", "new_project_chat", "project_instructions", "rename_project"}
PROJECTS_AND_SHARED |= {"delete_project", "shared", "continue_shared", "continue_shared_page"}
PROJECTS_AND_SHARED |= {"add_project_files", "remove_project_file"}
ACCOUNTS = {"login", "sign_in", "logout"}
ADMIN = {"admin_users", "add_user", "disable_user", "enable_user", "reset_password"}
ADMIN |= {"sign_out_user", "metrics"}
# Chat routes no page this offline app can show links to: the header's usage total is
# fetched by a finished reply's streamed fragment, a decision by a card only a tool
# that asks first makes. Tried like every chat route, straight from `app.routes`.
NOT_ON_A_PAGE = {"chat_usage", "decide"}
# Routes that name no chat and show every person the same (the tools and models).
SHARED = {"tools", "refresh_models"}
# The API: the key a request carries says who asks, not the cookie (tests/web/api).
API = {"api_models", "api_completions", "api_run_events", "api_cancel"}
PER_PERSON |= {"api_keys", "create_api_key", "revoke_api_key"}


@dataclass(frozen=True)
class Attempt:
    method: str
    path: str
    fields: tuple[tuple[str, str], ...] = ()
    htmx: bool = False


@dataclass
class Crawl:
    attempts: set[Attempt] = field(default_factory=set)
    pages: set[str] = field(default_factory=set)


def _route(app: Starlette, method: str, path: str) -> tuple[Route | Mount, dict[str, str]] | None:
    scope = {"type": "http", "method": method, "path": path.split("?")[0], "root_path": ""}
    for route in app.routes:
        match, child = route.matches(scope)
        if match == Match.FULL and isinstance(route, Route | Mount):
            return route, dict(child.get("path_params", {}))
    return None


def _fields(form: Node) -> tuple[tuple[str, str], ...]:
    found = []
    for node in form.iter():
        name = node.attrs.get("name")
        if not name or node.attrs.get("type") == "file":
            continue
        if node.tag == "textarea":
            found.append((name, node.text() or f"{SECRET} edited"))
        elif node.tag in ("input", "button") and node.attrs.get("value") is not None:
            found.append((name, node.attrs["value"] or ""))
        elif node.tag == "select":
            options = [o.attrs.get("value") or "" for o in node.find_all("option")]
            found.append((name, options[0] if options else ""))
    return tuple(found)


def _collect(page: Node, crawl: Crawl) -> None:
    for node in page.iter():
        for attr, method in (("href", "GET"), ("hx-get", "GET"), ("sse-connect", "GET")):
            target = node.attrs.get(attr)
            if target and target.startswith("/") and not target.startswith("/static/"):
                crawl.attempts.add(Attempt(method, target, htmx=attr == "hx-get"))
                if attr != "sse-connect":
                    crawl.pages.add(target)
        if node.tag == "form":
            method = (node.attrs.get("method") or "get").upper()
            action = node.attrs.get("action") or ""
            if action.startswith("/"):
                crawl.attempts.add(Attempt(method, action, _fields(node)))
                if method == "GET":
                    crawl.pages.add(action)
        if node.tag == "form" or node.attrs.get("hx-post"):  # a form, or a select that posts
            for attr in ("hx-post", "hx-get"):
                if node.attrs.get(attr):
                    verb = attr[3:].upper()
                    crawl.attempts.add(Attempt(verb, node.attrs[attr] or "", _fields(node), True))


async def _crawl(http: httpx.AsyncClient, start: list[str], app: Starlette) -> Crawl:
    """Every address Alice's pages reach, following her GET pages one step further."""
    crawl = Crawl()
    seen: set[str] = set()
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for headers in (HTML, HX):
            response = await http.get(path, headers=headers)
            assert response.status_code == 200, (path, response.status_code)
            _collect(parse_html(response.text), crawl)
        todo += [p for p in crawl.pages if p not in seen and _addresses_a_chat(app, "GET", p)]
    return crawl


def _addresses_a_chat(app: Starlette, method: str, path: str) -> bool:
    found = _route(app, method, path)
    return found is not None and bool({"chat_id", "run_id"} & set(found[1]))


async def _alice_makes_chats(client: WebClient, alice: httpx.AsyncClient) -> dict[str, str]:
    """Chats with versions (and an attached file), a stopped reply and a reply still
    streaming."""
    versions, stopped, live = await new_chat(alice), await new_chat(alice), await new_chat(alice)
    attached = [("files", ("notes.txt", f"notes {SECRET}".encode(), "text/plain"))]
    await alice.post(
        f"/chats/{versions}/messages", data={"text": f"first {SECRET}"}, files=attached
    )
    await client.wait_idle(versions)
    await alice.post(f"/chats/{versions}/messages", data={"text": f"second {SECRET}"})
    await client.wait_idle(versions)
    first, second = [r[0] for r in await rows(client.db, _RUNS, versions)]
    await alice.post(f"/chats/{versions}/regenerate", data={"run_id": second})
    await client.wait_idle(versions)
    await alice.post(f"/chats/{versions}/messages/{first}/edit", data={"text": f"again {SECRET}"})
    await client.wait_idle(versions)
    await alice.post(f"/chats/{stopped}/messages", data={"text": "count to 5000"})
    await client.wait_text(stopped, 40)
    await alice.post(f"/chats/{stopped}/runs/{await client.active_run(stopped)}/stop")
    await client.wait_idle(stopped)
    assert (await alice.post(f"/chats/{versions}/share")).status_code == 303  # a link to revoke
    await alice.post(f"/chats/{live}/messages", data={"text": "count to 10000"})
    await client.wait_text(live, 10)
    return {"versions": versions, "stopped": stopped, "live": live}


_RUNS = "SELECT run_id FROM chat_runs WHERE chat_id = ? ORDER BY seq"


async def _alices_rows(client: WebClient, chat_ids: list[str]) -> list[object]:
    marks = ",".join("?" * len(chat_ids))
    found: list[object] = []
    for table, column in (
        ("chats", "id"),
        ("chat_runs", "chat_id"),
        ("session_segments", "session_id"),
        ("sends", "chat_id"),
        ("run_inputs", "chat_id"),
        ("message_files", "chat_id"),
    ):
        got = await rows(client.db, f"SELECT * FROM {table} WHERE {column} IN ({marks})", *chat_ids)
        found.append(sorted(map(repr, got)))
    return found


def _steady(html: str) -> str:
    """A page with its per-render parts (a fresh client id for the next send) taken out."""
    return re.sub(r'name="client_id" value="[^"]*"', "", html)


async def test_another_persons_chats_are_404_on_every_route_and_change_nothing(
    web_client_factory: MakeClient,
):
    client = await web_client_factory(auth=AuthSettings("password"), offline_delay=0.01)
    await add_user(client, "alice")
    await add_user(client, "bob")
    app = client.app
    async with person(app, "alice") as alice, person(app, "bob") as bob:
        chats = await _alice_makes_chats(client, alice)
        bobs = await new_chat(bob)
        start = ["/", f"/search?q={SECRET}", *(f"/chats/{c}" for c in chats.values())]
        crawl = await _crawl(alice, start, app)
        theirs = list(chats.values())
        alice_runs = {r[0] for r in await rows(client.db, "SELECT run_id FROM chat_runs")}
        alice_runs.add(await client.active_run(chats["live"]) or "")
        before_rows = await _alices_rows(client, theirs)
        before_pages = {
            c: _steady((await alice.get(f"/chats/{chats[c]}", headers=HTML)).text)
            for c in ("versions", "stopped")
        }
        live_run = await client.active_run(chats["live"])

        tried: set[str] = set()
        for attempt in sorted(crawl.attempts, key=lambda a: (a.path, a.method, a.htmx)):
            found = _route(app, attempt.method, attempt.path)
            assert found is not None, f"Alice's page has a dead address: {attempt}"
            route, params = found
            if not {"chat_id", "run_id"} & set(params):
                continue
            tried.add(route.name)
            await _refused(bob, attempt)
            await _refused(bob, Attempt(attempt.method, attempt.path, attempt.fields, True))
            carried = set(params.values()) | {v for _, v in attempt.fields}
            if carried & alice_runs:  # Alice's run ids, on Bob's own chat
                mine = attempt.path.replace(params["chat_id"], bobs)
                await _refused(bob, Attempt(attempt.method, mine, attempt.fields, attempt.htmx))
        some_run = min(alice_runs - {""})
        for route in app.routes:
            if route.name in API:
                continue
            if isinstance(route, Route) and {"chat_id", "run_id"} & set(route.param_convertors):
                values = {"chat_id": chats["versions"], "run_id": some_run}
                wanted = {name: values.get(name, "x") for name in route.param_convertors}
                path = str(route.url_path_for(route.name, **wanted))
                for method in route.methods or ():
                    await _refused(bob, Attempt(method, path))

        chat_routes = {
            r.name
            for r in app.routes
            if isinstance(r, Route) and {"chat_id", "run_id"} & set(r.param_convertors)
        }
        unreached = sorted(chat_routes - tried - NOT_ON_A_PAGE - API)
        assert not unreached, (
            f"routes no page of Alice's reaches, so this test cannot try them as another "
            f"person: {unreached}. Give Alice content that shows them."
        )
        names = {r.name for r in app.routes if isinstance(r, Route | Mount)}
        known = PER_PERSON | ACCOUNTS | ADMIN | SHARED | API | PROJECTS_AND_SHARED | {"static"}
        unknown = sorted(names - chat_routes - known)
        assert not unknown, f"routes this test does not cover yet: {unknown}"

        # Alice's side: every row and every page as it was, the live reply still live.
        assert await _alices_rows(client, theirs) == before_rows
        for key, page in before_pages.items():
            assert _steady((await alice.get(f"/chats/{chats[key]}", headers=HTML)).text) == page
        chat = await client.web.store.get(Owner(None), chats["live"])
        assert chat is not None and chat.active_run_id == live_run
        assert chat.stop_requested_run_id is None
        await alice.post(f"/chats/{chats['live']}/runs/{live_run}/stop")
        await client.wait_idle(chats["live"])

        await _per_person_routes_show_only_bobs_own(client, alice, bob, theirs)
        for name in sorted(ADMIN):  # Bob is no administrator
            route = next(r for r in app.routes if isinstance(r, Route) and r.name == name)
            path = route.url_path_for(name, **{p: "x" for p in route.param_convertors})
            for method in route.methods or ():
                assert (await bob.request(method, str(path))).status_code == 404


async def _refused(bob: httpx.AsyncClient, attempt: Attempt) -> None:
    headers = dict(HX) if attempt.htmx else dict(HTML)
    if attempt.method in ("GET", "HEAD"):
        response = await bob.request(attempt.method, attempt.path, headers=headers)
    else:
        response = await bob.request(
            attempt.method, attempt.path, data=dict(attempt.fields), headers=headers
        )
    assert response.status_code == 404, (attempt, response.status_code, response.text[:300])
    assert SECRET not in response.text, attempt


async def _per_person_routes_show_only_bobs_own(
    client: WebClient, alice: httpx.AsyncClient, bob: httpx.AsyncClient, theirs: list[str]
) -> None:
    home = parse_html((await bob.get("/", headers=HTML)).text)
    listed = {a.attrs["href"] for a in home.find("nav", aria_label="Chats").find_all("a")}
    assert not listed & {f"/chats/{c}" for c in theirs} and len(listed) == 1
    for headers in (HTML, HX):
        found = await bob.get("/search", params={"q": SECRET}, headers=headers)
        links = {a.attrs.get("href") for a in parse_html(found.text).find_all("a")}
        assert found.status_code == 200 and not links & {f"/chats/{c}" for c in theirs}
    exported = await alice.get(f"/chats/{theirs[0]}/export.json")
    imported = await bob.post(
        "/chats/import", files={"file": ("chat.json", exported.content, "application/json")}
    )
    assert imported.status_code == 303
    copy = imported.headers["location"].rsplit("/", 1)[1]
    bob_id = (await client.web.store.users.find("bob")).id  # type: ignore[union-attr]
    assert await rows(client.db, "SELECT user_id FROM chats WHERE id = ?", copy) == [(bob_id,)]
    assert (await alice.get(f"/chats/{copy}", headers=HTML)).status_code == 404
    # A client message id of Alice's, sent again by Bob, starts his own chat, not hers.
    form = parse_html((await alice.get("/", headers=HTML)).text).find("input", name="client_id")
    client_id = form.attrs["value"] or ""
    await alice.post("/chats", data={"text": f"new {SECRET}", "client_id": client_id})
    again = await bob.post("/chats", data={"text": "mine", "client_id": client_id})
    assert again.headers["location"].rsplit("/", 1)[1] not in theirs
    started = again.headers["location"].rsplit("/", 1)[1]
    assert await rows(client.db, "SELECT user_id FROM chats WHERE id = ?", started) == [(bob_id,)]

    async def settled() -> bool:
        running = "SELECT id FROM chats WHERE active_run_id IS NOT NULL AND id <> ?"
        return not await rows(client.db, running, theirs[2])

    await eventually(settled, 10, "the new chats' replies to finish")


async def test_the_chat_layer_finds_nothing_of_anyone_elses(web_client_factory: MakeClient):
    """The same isolation below the views: the service and the store, asked for another
    owner's chat, answer not found and write nothing."""
    client = await web_client_factory(auth=AuthSettings("password"))
    alice, bob = await add_user(client, "alice"), await add_user(client, "bob")
    service, store = client.web.chats, client.web.store
    chat = await service.new_chat(alice.owner)
    await service.send(alice.owner, chat.id, f"hello {SECRET}", None)
    await client.wait_idle(chat.id)
    run_id = (await rows(client.db, _RUNS, chat.id))[0][0]
    before = await _alices_rows(client, [chat.id])
    them = bob.owner
    for outcome in (
        await service.send(them, chat.id, "mine now", None),
        await service.edit(them, chat.id, run_id, "edited"),
        await service.regenerate(them, chat.id, run_id),
        await service.continue_reply(them, chat.id, run_id),
        await service.switch(them, chat.id, run_id),
        await service.branch(them, chat.id, run_id),
        await service.stop(them, chat.id, run_id),
        await service.stored_reply(them, chat.id, run_id),
        await service.rename(them, chat.id, "taken"),
        await service.delete(them, chat.id),
    ):
        assert isinstance(outcome, ChatNotFound), outcome
    assert await service.get(them, chat.id) is None
    assert await service.follow(them, chat.id, run_id) is None
    assert await service.export(them, chat.id) is None
    assert await service.search(them, SECRET) == []
    assert await service.recent(them) == []
    assert await store.page(them, chat.id, before=None, limit=10, also=[]) is None
    assert await store.shown_run(them, chat.id, run_id) is None
    assert (await store.tree(them, chat.id)).nodes == {}
    assert await store.switch(them, chat.id, run_id) is False
    assert await store.branch(them, chat.id, run_id, "copy") is None
    assert await store.rename(them, chat.id, "taken") is False
    assert await store.delete(them, chat.id, [run_id]) is False
    assert await store.find_send(them, "anything") is None
    assert await _alices_rows(client, [chat.id]) == before
    assert [c.id for c in await service.recent(alice.owner)] == [chat.id]
