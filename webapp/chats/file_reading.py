"""What an attached file is, judged by its bytes, and the text a model reads from it.

A file's bytes decide its type (SPEC §14): its name and the type a browser
claims never do, so an executable named ``.png`` is refused as what it is.
Accepted: PNG, JPEG, WebP and GIF images, PDF (text through `pypdf`), Word
``.docx`` (`python-docx`) and UTF-8 text. Anything else, or a file of those
kinds that cannot be read (encrypted, corrupt, too many pages, a zip that
unpacks to far more than it holds), raises `Unreadable` with the reason a
person can act on.

`read_file` is plain, blocking code: the app runs it in a worker process of
its own (`webapp.chats.file_worker`), bounded in time and memory, never on
the event loop.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass

IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")
PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
TEXT = "text/plain"

CHUNK_CHARS = 1_500  # about this long, an excerpt the model may be sent
MAX_UNPACKED_BYTES = 200 * 1024 * 1024  # what a .docx may unpack to, all parts together
MAX_PACKING_RATIO = 100  # a part that unpacks to 100 times its size is a bomb, not a document


class Unreadable(ValueError):
    """The file is not one the app takes, or cannot be read; says why (not which file)."""


@dataclass(frozen=True)
class FileText:
    """What `read_file` found: the type, and a document's text by page (None: an image).

    A document without pages (Word, text) is one "page" numbered None.
    """

    media_type: str
    pages: tuple[str, ...] | None
    paged: bool = False  # the pages are a PDF's, numbered from 1

    @property
    def text(self) -> str:
        return "\n\n".join(self.pages or ())


def sniff(data: bytes) -> str | None:
    """The media type the bytes start like, among those kept as they are (images, PDF,
    zip-based Word); None for anything else (text is judged by decoding it)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data[:1024].lstrip().startswith(b"%PDF-"):
        return PDF
    if data.startswith(b"PK\x03\x04"):
        return DOCX
    return None


def read_file(data: bytes, max_pdf_pages: int) -> FileText:
    """The file's type and text; `Unreadable` with the reason when it cannot be taken."""
    kind = sniff(data)
    if kind in IMAGE_TYPES:
        return FileText(kind, None)
    if kind == PDF:
        return FileText(PDF, read_pdf(data, max_pdf_pages), paged=True)
    if kind == DOCX:
        return FileText(DOCX, (read_docx(data),))
    return FileText(TEXT, (read_text(data),))


def read_text(data: bytes) -> str:
    if b"\x00" in data:
        raise Unreadable(
            "its bytes are not an image (PNG, JPEG, WebP, GIF), a PDF, a Word .docx file "
            "or text, whatever its name says"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unreadable(
            f"it is not UTF-8 text (byte {exc.start:,} is not UTF-8); save it as UTF-8 "
            "and attach it again"
        ) from None
    return text.removeprefix("\ufeff")


def read_pdf(data: bytes, max_pages: int) -> tuple[str, ...]:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            raise Unreadable("the PDF is encrypted (password-protected); attach a copy without one")
        count = len(reader.pages)
        if count > max_pages:
            raise Unreadable(f"the PDF has {count:,} pages; the limit is {max_pages:,}")
        if count == 0:
            raise Unreadable("the PDF has no pages")
        # NUL is no text a database column takes (PostgreSQL refuses it).
        return tuple((page.extract_text() or "").replace("\x00", "") for page in reader.pages)
    except Unreadable:
        raise
    except (PyPdfError, ValueError, TypeError, KeyError, AttributeError, IndexError,
            RecursionError, OSError, AssertionError) as exc:  # fmt: skip
        raise Unreadable(f"the PDF is damaged and cannot be read ({type(exc).__name__})") from None


def read_docx(data: bytes) -> str:
    from docx import Document

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            parts = archive.infolist()
            names = {p.filename for p in parts}
            if "word/document.xml" not in names:
                raise Unreadable(
                    "it is a zip file but not a Word .docx document (no word/document.xml)"
                )
            unpacked = sum(p.file_size for p in parts)
            if unpacked > MAX_UNPACKED_BYTES or any(
                p.file_size > MAX_PACKING_RATIO * max(p.compress_size, 1024) for p in parts
            ):
                raise Unreadable(
                    f"it unpacks to {unpacked:,} bytes from {len(data):,}: a zip bomb, "
                    "not a document"
                )
        document = Document(io.BytesIO(data))
    except Unreadable:
        raise
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError) as exc:
        raise Unreadable(f"the Word file is damaged and cannot be read ({type(exc).__name__})")
    lines = [p.text for p in document.paragraphs]
    for table in document.tables:
        for row in table.rows:
            lines.append("\t".join(cell.text for cell in row.cells))
    return "\n".join(lines).replace("\x00", "")


@dataclass(frozen=True)
class Chunk:
    """A piece of a document's text that may go to the model alone."""

    seq: int  # its place in the document
    page: int | None  # a PDF's page number (from 1); None for a document without pages
    text: str


def chunks(found: FileText, size: int = CHUNK_CHARS) -> list[Chunk]:
    """The document's text in pieces of about ``size`` characters, cut between words
    where it can, never across two pages."""
    out: list[Chunk] = []
    for number, page in enumerate(found.pages or (), 1):
        for piece in _pieces(page, size):
            out.append(Chunk(len(out), number if found.paged else None, piece))
    return out


def _pieces(text: str, size: int) -> Iterator[str]:
    start, end = 0, len(text)
    while start < end:
        stop = min(start + size, end)
        if stop < end:
            cut = max(
                text.rfind("\n", start + size // 2, stop), text.rfind(" ", start + size // 2, stop)
            )
            if cut > start:
                stop = cut + 1
        piece = text[start:stop].strip()
        if piece:
            yield piece
        start = stop


def first_line(text: str) -> str:
    """The first line of ``text`` that holds something, stripped ("" if none)."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""
