"""Attached files in a chat's JSON export: written with their bytes, read back checked.

The export's ``files`` list holds each file the chat holds once: ``id`` (the
sha256 of its bytes, which the user entries' ``attachments`` name), ``name``,
``media_type`` and ``data`` (base64). An import checks the list's shape here,
and that every attachment of every entry names a file of it; the bytes are
then read again under the app's limits (`webapp.chats.intake`) before
anything is written, so a file that would be refused as an upload is refused
in an import too. A file without attachments has no ``files`` key and
imports as before.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from typing import Any

from webapp.transcript import Entry, UserEntry

CONTEXTS = ("", "whole", "excerpts")


class FilesError(ValueError):
    """The export's files or attachments are not as written; says where."""


@dataclass(frozen=True)
class ExportedFile:
    id: str
    name: str
    media_type: str
    data: bytes


def files_to_json(files: list[ExportedFile]) -> list[dict[str, Any]]:
    return [
        {
            "id": f.id,
            "name": f.name,
            "media_type": f.media_type,
            "data": base64.b64encode(f.data).decode("ascii"),
        }
        for f in files
    ]


def check_attachments(raw: dict[str, Any], where: str) -> None:
    """An entry's ``attachments`` as the exporter writes them (or none)."""
    if "attachments" not in raw:
        return
    items = raw["attachments"]
    if raw.get("type") != "user" or not isinstance(items, list):
        raise FilesError(f"{where}.attachments: only a user message has a list of them.")
    for i, item in enumerate(items):
        at = f"{where}.attachments[{i}]"
        if not isinstance(item, dict):
            raise FilesError(f"{at}: not an object.")
        for key in ("id", "name", "media_type"):
            if not isinstance(item.get(key), str) or not item[key]:
                raise FilesError(f"{at}.{key}: missing or not a string.")
        size = item.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise FilesError(f"{at}.size: not a whole number from 0.")
        if item.get("context", "") not in CONTEXTS:
            raise FilesError(f"{at}.context: one of {', '.join(map(repr, CONTEXTS))}.")


def parse_files(document: dict[str, Any], entries: list[Entry]) -> list[ExportedFile]:
    """The ``files`` of an export, each decoded and matching its id; every attachment of
    ``entries`` names one of them."""
    raw = document.get("files", [])
    if not isinstance(raw, list):
        raise FilesError("files: not a list.")
    found: dict[str, ExportedFile] = {}
    for i, item in enumerate(raw):
        where = f"files[{i}]"
        if not isinstance(item, dict):
            raise FilesError(f"{where}: not an object.")
        for key in ("id", "name", "media_type", "data"):
            if not isinstance(item.get(key), str):
                raise FilesError(f"{where}.{key}: missing or not a string.")
        try:
            data = base64.b64decode(item["data"], validate=True)
        except (binascii.Error, ValueError):
            raise FilesError(f"{where}.data: not base64.") from None
        if hashlib.sha256(data).hexdigest() != item["id"]:
            raise FilesError(f"{where}.id: not the sha256 of its data.")
        found[item["id"]] = ExportedFile(item["id"], item["name"], item["media_type"], data)
    for entry in entries:
        if isinstance(entry, UserEntry):
            missing = [a.name for a in entry.attachments if a.id not in found]
            if missing:
                raise FilesError(f"files: the attached {missing[0]!r} is not in the file.")
    return list(found.values())
