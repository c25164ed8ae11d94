"""SPEC §15 isolation: another person's project, and another person's chat's share link,
are 404 on every route that manages them, and nothing of theirs changes.

The routes are not a list written by hand: every route of `app.routes` whose path
names a ``project_id``, and every route a chat's Share page or Project select posts
to, is tried by Bob with Alice's ids, with every method it takes. A route added later
with a project id in its path is tried too; one that names neither a project nor a
chat nor a token fails the test until it is covered.
"""

from __future__ import annotations

import re

import httpx
from people import HTML, add_user, new_chat, person, rows
from starlette.routing import Route
from webhelpers import MakeClient, parse_html

from webapp.web.auth import AuthSettings

ON_BOTH_DATABASES = True
SECRET = "wombat-4402"
SHARE_AND_MOVE = {"share_page", "share", "revoke_share", "move_chat"}


async def _alices_rows(db: object) -> list[object]:
    return [
        sorted(map(repr, await rows(db, f"SELECT * FROM {table}")))  # type: ignore[arg-type]
        for table in ("projects", "shares", "share_segments", "project_files")
    ] + [sorted(map(repr, await rows(db, "SELECT id, project_id FROM chats")))]  # type: ignore[arg-type]


async def test_another_persons_projects_and_share_links_are_404(web_client_factory: MakeClient):
    client = await web_client_factory(auth=AuthSettings("password"), offline_delay=0)
    await add_user(client, "alice")
    await add_user(client, "bob")
    app = client.app
    async with person(app, "alice") as alice, person(app, "bob") as bob:
        made = await alice.post("/projects", data={"name": f"Plans {SECRET}"})
        project = made.headers["location"].rsplit("/", 1)[1]
        await alice.post(f"/projects/{project}/instructions", data={"instructions": SECRET})
        chat = (await alice.post(f"/projects/{project}/chats")).headers["location"]
        chat_id = chat.rsplit("/", 1)[1]
        await alice.post(f"/chats/{chat_id}/messages", data={"text": f"hello {SECRET}"})
        await client.wait_idle(chat_id)
        added = await alice.post(
            f"/projects/{project}/files",
            files=[("files", ("plan.txt", f"notes {SECRET}".encode(), "text/plain"))],
        )
        assert added.status_code == 303, added.text
        ((file_id,),) = await rows(client.db, "SELECT file_id FROM project_files")
        await alice.post(f"/chats/{chat_id}/share")
        share_page = (await alice.get(f"/chats/{chat_id}/share", headers=HTML)).text
        token = re.search(r"/s/([A-Za-z0-9_-]{43})", share_page)
        assert token is not None
        bobs_chat = await new_chat(bob)
        bobs_project = (await bob.post("/projects", data={"name": "Mine"})).headers["location"]
        bobs_project_id = bobs_project.rsplit("/", 1)[1]
        before = await _alices_rows(client.db)

        values = {
            "project_id": project,
            "chat_id": chat_id,
            "token": token.group(1),
            "file_id": file_id,
        }
        tried: set[str] = set()
        for route in app.routes:
            if not isinstance(route, Route):
                continue
            params = set(route.param_convertors)
            if "project_id" not in params and route.name not in SHARE_AND_MOVE:
                continue
            path = str(route.url_path_for(route.name, **{p: values[p] for p in params}))
            for method in sorted(route.methods or ()):
                taken = {"project_id": bobs_project_id, "name": "plan.txt"}
                for fields in ({}, taken):
                    await _refused(bob, method, path, fields)
            tried.add(route.name)
        assert SHARE_AND_MOVE <= tried and "project" in tried, tried
        # Bob's own chat into Alice's project: 404, and his chat stays where it was.
        moved = await bob.post(f"/chats/{bobs_chat}/project", data={"project_id": project})
        assert moved.status_code == 404
        # Alice's project is nowhere on Bob's pages.
        home = parse_html((await bob.get("/", headers=HTML)).text)
        names = [a.norm_text() for a in home.find("nav", aria_label="Projects").find_all("a")]
        assert names == ["Mine"] and SECRET not in home.text()
        assert await _alices_rows(client.db) == before
        # Her own pages still answer her.
        page = await alice.get(f"/projects/{project}", headers=HTML)
        assert page.status_code == 200 and SECRET in page.text


async def _refused(bob: httpx.AsyncClient, method: str, path: str, fields: dict[str, str]) -> None:
    if method in ("GET", "HEAD"):
        response = await bob.request(method, path, headers=HTML)
    else:
        response = await bob.request(method, path, data=fields, headers=HTML)
    assert response.status_code == 404, (method, path, response.status_code)
    assert SECRET not in response.text, (method, path)
