"""Attachments on PostgreSQL with two app processes: a file attached through one is
downloaded from the other, and the model that runs in either is sent it."""

from __future__ import annotations

from attachment_files import PNG, pdf
from webhelpers import eventually, messages, parse_html, two_processes

from webapp.models import OfflineModel


async def test_a_file_attached_through_one_process_downloads_from_the_other(postgres_dsn: str):
    offline = {"model": OfflineModel(delay=0)}
    async with two_processes(postgres_dsn, offline, offline) as (a, b):
        chat_id = str((await a.post("/chats")).headers["location"].rsplit("/", 1)[1])
        document = pdf(["Minutes of the meeting\nall agreed", "page two"])
        sent = await a.post(
            f"/chats/{chat_id}/messages",
            data={"text": "Here"},
            files=[
                ("files", ("minutes.pdf", document, "image/png")),  # the bytes decide
                ("files", ("pixel.png", PNG, "text/plain")),
            ],
        )
        assert sent.status_code == 303, sent.text

        async def done() -> bool:
            page = parse_html((await b.get(f"/chats/{chat_id}")).text)
            found = page.find_all(data_role="assistant")
            return bool(found) and found[-1].attrs.get("data-status") == "completed"

        await eventually(done)
        page = parse_html((await b.get(f"/chats/{chat_id}")).text)
        shown = messages(page)[0].find_all(data_role="attachment")
        assert [n.attrs["data-name"] for n in shown] == ["minutes.pdf", "pixel.png"]
        for node, data, media_type in zip(
            shown, (document, PNG), ("application/pdf", "image/png"), strict=True
        ):
            download = await b.get(str(node.find("a").attrs["href"]))
            assert download.status_code == 200
            assert download.content == data
            assert download.headers["content-type"] == media_type
        reply = messages(page)[1].find(class_="content").norm_text()
        assert "minutes.pdf begins: Minutes of the meeting" in reply


async def test_the_other_process_shows_the_files_of_a_reply_still_streaming(postgres_dsn: str):
    slow = {"model": OfflineModel(delay=0.02)}
    async with two_processes(postgres_dsn, slow, slow) as (a, b):
        chat_id = str((await a.post("/chats")).headers["location"].rsplit("/", 1)[1])
        sent = await a.post(
            f"/chats/{chat_id}/messages",
            data={"text": "count to 400"},
            files=[("files", ("list.txt", b"one\ntwo\n", "text/plain"))],
        )
        assert sent.status_code == 303, sent.text
        page = parse_html((await b.get(f"/chats/{chat_id}")).text)
        user, reply = messages(page)
        assert reply.attrs["data-status"] == "streaming"  # A runs it; B follows it
        shown = user.find(data_role="attachment")
        assert shown.attrs["data-name"] == "list.txt"
        download = await b.get(str(shown.find("a").attrs["href"]))
        assert download.content == b"one\ntwo\n"
