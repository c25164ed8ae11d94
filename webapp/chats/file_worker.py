"""Reading attached files in a child process: off the event loop, bounded in time and memory.

A PDF parser or a zip reader given a hostile file can take minutes or
gigabytes; in a thread of the app's own process neither could be stopped.
So each document is read by a child process of its own (``python -m
webapp.chats.file_worker``, the file on its stdin, its text as JSON on its
stdout) that limits its own address space (`MEMORY_LIMIT`) before it reads a
byte, and is killed when it has not answered within ``time_limit`` seconds.
The app awaits the child like any other I/O; the JSON is decoded in a thread.
An image needs no parsing (its first bytes are its type) and text only
decoding (in a thread): neither goes to a child.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from webapp.chats.file_reading import (
    IMAGE_TYPES,
    Chunk,
    FileText,
    Unreadable,
    chunks,
    read_file,
    sniff,
)

TIME_LIMIT = 120.0  # seconds to read one file
INLINE_BYTES = 256 * 1024  # an image or a text this small is read without a thread hop
MEMORY_LIMIT = 2048 * 1024 * 1024  # bytes of address space of a reading process


@dataclass(frozen=True)
class ReadResult:
    digest: str  # sha256 of the bytes, hex: the id the file is stored under
    found: FileText
    chunks: tuple[Chunk, ...]


class FileReader:
    """Reads attached files in child processes, at most ``processes`` at a time."""

    def __init__(self, processes: int = 2, time_limit: float = TIME_LIMIT) -> None:
        self.time_limit = time_limit
        self._slots = asyncio.Semaphore(processes)

    async def read(self, data: bytes, max_pdf_pages: int) -> ReadResult:
        """The file's hash, type, text and chunks; `Unreadable` when it cannot be taken."""
        kind = sniff(data)
        if kind in IMAGE_TYPES or kind is None:
            # An image is its bytes; text only needs decoding, linear in its size (which
            # the limit bounds): a small one is read at once, a large one in a thread.
            if len(data) <= INLINE_BYTES:
                return _read_here(data)
            return await asyncio.to_thread(_read_here, data)
        digest = await asyncio.to_thread(_sha256, data)
        async with self._slots:
            output = await self._run(data, max_pdf_pages)
        found, pieces = await asyncio.to_thread(_decode, output)
        return ReadResult(digest, found, pieces)

    async def _run(self, data: bytes, max_pdf_pages: int) -> bytes:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "webapp.chats.file_worker", str(max_pdf_pages),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            async with asyncio.timeout(self.time_limit):
                output, _ = await process.communicate(data)
        except TimeoutError:
            raise Unreadable(
                f"reading it took longer than {self.time_limit:g} seconds and was stopped"
            ) from None
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        if process.returncode != 0 or not output:
            raise Unreadable("reading it needed more memory than a file may take")
        return output


def _read_here(data: bytes) -> ReadResult:
    found = read_file(data, 0)
    pieces = tuple(chunks(found)) if found.pages is not None else ()
    return ReadResult(_sha256(data), found, pieces)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _decode(output: bytes) -> tuple[FileText, tuple[Chunk, ...]]:
    """The child's answer: a head line, then one JSON line per page and per chunk.

    Decoded line by line, never as one big value: one ``json.loads`` of megabytes
    would hold the interpreter lock for as long, and stall the event loop with it.
    """
    lines = output.split(b"\n")
    head: dict[str, Any] = json.loads(lines[0])
    if "error" in head:
        raise Unreadable(str(head["error"]))
    count = int(head["pages"])
    pages = tuple(json.loads(line) for line in lines[1 : 1 + count])
    pieces = tuple(Chunk(i, *json.loads(line)) for i, line in enumerate(lines[1 + count :]) if line)
    return FileText(head["media_type"], pages, bool(head["paged"])), pieces


def _main() -> int:
    """The child: limit memory, read stdin, answer one JSON object on stdout."""
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ValueError, OSError):  # a lower hard limit already: that one holds
        pass
    with contextlib.suppress(OSError):
        os.nice(10)  # on a busy machine the server's own requests go first
    data = sys.stdin.buffer.read()
    try:
        found = read_file(data, int(sys.argv[1]))
        pages = found.pages or ()
        head = {"media_type": found.media_type, "pages": len(pages), "paged": found.paged}
        lines = [head, *pages, *([c.page, c.text] for c in chunks(found))]
    except Unreadable as exc:
        lines = [{"error": str(exc)}]
    except MemoryError:
        return 3
    out = sys.stdout.buffer
    for line in lines:  # JSON escapes every line break: one value per line
        out.write(json.dumps(line).encode("ascii") + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
