"""Attachments (issue 30): what accepting a big PDF costs, and what a document adds to a reply.

Run from the repository root: ``python bench/attachments.py`` (a few minutes:
most of it is making the PDF and pypdf reading it, twice).

The app runs under a real uvicorn server on 127.0.0.1 in this process, with a
heartbeat task on its loop (the loop's worst stall, as in bench/loop_stall.py);
the client runs in a thread of its own. Figures:

- **accept**: a 20 MB PDF of 2,000 pages sent with a message. Server CPU is this
  process's CPU plus its children's (the reading process) from the POST until its
  answer (the message recorded, files stored); beside it, the CPU of pypdf's own
  ``PdfReader(...).pages[i].extract_text()`` over the same file, in this run. The
  goal: at most 1.5 times pypdf's; the worst loop stall meanwhile at most 100 ms.
  Beside the stall, the same loop's worst stall with nothing to do: on a loaded
  machine the OS alone delays it, and that part is not the app's.
- **excerpts**: the CPU of picking a question's excerpts from that PDF (what a
  model call does before it is sent: the full-text query and the chunks read),
  per question, for ten questions. Goal: at most 50 ms.
- **first token**: a reply through a fake OpenAI endpoint on loopback (it streams
  at once), from the POST to the first text event of the reply's stream, with a
  60,000-character document attached whole and without it; the median of 15 each,
  alternated. Goal: at most 20 ms added.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from loop_stall import Heartbeat  # bench/loop_stall.py: the loop's worst stall
from pypdf import PdfReader, PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject
from stream import free_port  # bench/stream.py

from webapp.chats.file_context import FileContext
from webapp.chats.intake import AttachmentLimits
from webapp.chats.users import EVERY_CHAT
from webapp.web import create_app

COMMON = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "on",
    "by",
    "be",
    "at",
    "this",
    "from",
    "or",
    "which",
]


def vocabulary(size: int = 5_000) -> list[str]:
    """Common English words first, then made-up ones: drawn by Zipf's law, the text has
    a real document's shape (a few words everywhere, most words in a few places)."""
    rng = random.Random(30)
    letters = "abcdefghijklmnopqrstuvwxyz"
    made = {"".join(rng.choice(letters) for _ in range(rng.randint(4, 10))) for _ in range(size)}
    return COMMON + sorted(made)[: size - len(COMMON)]


WORDS = vocabulary()
WEIGHTS = [1 / (rank + 1) for rank in range(len(WORDS))]


def make_pdf(pages: int, target_bytes: int) -> bytes:
    """A PDF of ``pages`` pages of text lines, about ``target_bytes`` long (uncompressed
    content streams, as scanned-then-OCRed and generated reports often are)."""
    writer = PdfWriter()
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    per_page = target_bytes // pages
    rng = random.Random(2000)
    for number in range(pages):
        lines, size = [], 0
        i = 0
        while size < per_page - 40:
            words = " ".join(rng.choices(WORDS, WEIGHTS, k=8))
            line = f"({number + 1}.{i} {words}) Tj 0 -11 Td "
            lines.append(line)
            size += len(line)
            i += 1
        stream = DecodedStreamObject()
        stream.set_data(("BT /F1 9 Tf 40 760 Td " + "".join(lines) + "ET").encode("latin-1"))
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Contents")] = stream
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def cpu_now() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pypdf_cpu(data: bytes) -> float:
    start = time.process_time()
    reader = PdfReader(io.BytesIO(data))
    for page in reader.pages:
        page.extract_text()
    return time.process_time() - start


@contextlib.asynccontextmanager
async def serve(app: Starlette) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def fake_endpoint() -> str:
    """An OpenAI-compatible endpoint in a thread of its own: streams "ok done" at once."""

    async def completions(request: Request) -> StreamingResponse:
        await request.body()

        async def chunks() -> AsyncIterator[bytes]:
            for text in ("ok", " done"):
                delta = {"choices": [{"index": 0, "delta": {"content": text}}]}
                yield f"data: {json.dumps(delta)}\n\n".encode()
            end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            yield f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode()

        return StreamingResponse(chunks(), media_type="text/event-stream")

    port = free_port()
    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}/v1"


def in_thread(fn, *args):  # type: ignore[no-untyped-def]
    return asyncio.to_thread(fn, *args)


def post_file(base: str, chat_id: str, text: str, name: str, data: bytes | None) -> float:
    files = [("files", (name, data, "application/octet-stream"))] if data is not None else None
    with httpx.Client(base_url=base, timeout=600) as http:
        start = time.perf_counter()
        sent = http.post(f"/chats/{chat_id}/messages", data={"text": text}, files=files)
        took = time.perf_counter() - start
    if sent.status_code != 303:
        raise RuntimeError(f"not accepted: {sent.status_code} {sent.text[-400:]}")
    return took


def first_token(base: str, chat_id: str, text: str, document: bytes | None) -> float:
    """Seconds from the POST to the first text event of its reply's stream."""
    files = [("files", ("doc.txt", document, "text/plain"))] if document is not None else None
    with httpx.Client(base_url=base, timeout=60) as http:
        start = time.perf_counter()
        sent = http.post(
            f"/chats/{chat_id}/messages",
            data={"text": text},
            files=files,
            headers={"HX-Request": "true"},
        )
        answered = time.perf_counter() - start
        if sent.status_code != 200:
            raise RuntimeError(f"not sent: {sent.status_code} {sent.text[-300:]}")
        marker = 'sse-connect="'
        at = sent.text.rindex(marker) + len(marker)
        url = sent.text[at : sent.text.index('"', at)].replace("&amp;", "&")
        with http.stream("GET", url) as events:
            for line in events.iter_lines():
                if line == "event: text":
                    return time.perf_counter() - start
                if line == "event: done":  # the text came with the send's answer itself
                    return answered
    raise RuntimeError("the reply streamed no text")


async def wait_idle(app: Starlette, chat_id: str) -> None:
    chats = app.state.web.chats
    for _ in range(6000):
        chat = await chats.get(EVERY_CHAT, chat_id)
        if chat is not None and chat.active_run_id is None:
            return
        await asyncio.sleep(0.01)
    raise RuntimeError("the reply did not finish")


async def accept_and_excerpts(folder: Path, pages: int, megabytes: float) -> None:
    print(f"making a {pages:,}-page PDF of about {megabytes:g} MB ...", flush=True)
    data = await in_thread(make_pdf, pages, int(megabytes * 1024 * 1024))
    print(f"  {len(data) / 1024 / 1024:.1f} MB", flush=True)
    baseline = await in_thread(pypdf_cpu, data)
    limits = AttachmentLimits(max_mb=max(megabytes * 1.2, 20), max_pdf_pages=pages)
    app = create_app(folder / "accept.db", offline_delay=0, attachment_limits=limits)
    beat = Heartbeat()
    async with serve(app) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            chat_id = (await http.post("/chats")).headers["location"].rsplit("/", 1)[1]
        beating = asyncio.get_running_loop().create_task(beat.run())
        await asyncio.sleep(0.05)
        beat.worst = 0.0
        before = cpu_now()
        took = await in_thread(post_file, base, chat_id, "What does it say?", "big.pdf", data)
        spent = cpu_now() - before
        stall = beat.worst
        beating.cancel()
        await wait_idle(app, chat_id)
        # The same loop with nothing to do, for as long: what the machine's other load
        # alone costs it (on a shared machine the OS may not run this process at once).
        idle = Heartbeat()
        idling = asyncio.get_running_loop().create_task(idle.run())
        await asyncio.sleep(min(took, 30))
        idling.cancel()
        print(
            f"accept: {took:.2f} s wall, server CPU {spent:.2f} s, pypdf extract_text "
            f"{baseline:.2f} s CPU: {spent / baseline:.2f} x; worst loop stall "
            f"{stall * 1000:.1f} ms (idle, the same loop over {min(took, 30):.0f} s: "
            f"{idle.worst * 1000:.1f} ms)",
            flush=True,
        )
        store = app.state.web.store
        segments = await app.state.web.session.segments(chat_id)
        entry = segments[0].entries[0]
        files = entry.attachments
        print(f"  recorded as {files[0].context} ({files[0].size:,} bytes)", flush=True)
        context = FileContext(store.files, limits.context_chars)
        rng = random.Random(7)
        questions = [  # a few words of the document, among words found everywhere
            f"What does the document say about {' and '.join(rng.sample(WORDS[20:2000], n))}?"
            for n in (1, 2, 3, 1, 2, 3, 4, 1, 2, 5)
        ]
        spent_each = []
        for question in questions:
            asked = type(entry)(question, files)
            start = time.process_time()
            sent = await context.resolve(asked)
            spent_each.append(time.process_time() - start)
            assert sent[0].text and sent[0].text.startswith("[big.pdf, page ")
        print(
            f"excerpts: CPU per question median {statistics.median(spent_each) * 1000:.1f} ms, "
            f"worst {max(spent_each) * 1000:.1f} ms ({len(questions)} questions, "
            f"{limits.context_chars:,}-character budget)",
            flush=True,
        )


async def first_tokens(folder: Path, rounds: int) -> None:
    endpoint = fake_endpoint()
    from webapp.models.endpoints import ModelRegistry

    models = ModelRegistry.from_settings([], base_url=endpoint, model="fake", api_key="x")
    app = create_app(folder / "first.db", models=models)
    line = "The quick brown fox jumps over the lazy dog; " * 2
    document = ((line + "\n") * (60_000 // (len(line) + 1) + 1))[:60_000].encode()
    timings: dict[bool, list[float]] = {False: [], True: []}
    async with serve(app) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            chat_ids = {
                flag: (await http.post("/chats")).headers["location"].rsplit("/", 1)[1]
                for flag in (False, True)
            }
        for n in range(rounds + 2):
            for with_doc in (False, True):
                chat_id = chat_ids[with_doc]
                took = await in_thread(
                    first_token, base, chat_id, f"message {n}", document if with_doc else None
                )
                await wait_idle(app, chat_id)
                if n >= 2:  # the first two warm up the connections and caches
                    timings[with_doc].append(took)
    without = statistics.median(timings[False])
    with_doc = statistics.median(timings[True])
    print(
        f"first token: {without * 1000:.1f} ms without the document, {with_doc * 1000:.1f} ms "
        f"with 60,000 characters sent whole: {(with_doc - without) * 1000:+.1f} ms "
        f"(medians of {rounds})",
        flush=True,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--mb", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    with tempfile.TemporaryDirectory() as folder:
        await accept_and_excerpts(Path(folder), args.pages, args.mb)
        await first_tokens(Path(folder), args.rounds)


if __name__ == "__main__":
    asyncio.run(main())
