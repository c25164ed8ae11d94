"""Projects (SPEC §15): make one, its page, its chats, instructions, rename and delete.

Every route carries the ``{project_id}``; the project store filters by the
person asking, so another person's project is answered 404 exactly as one
that does not exist. Forms post and redirect (303), so all of it works
without JavaScript.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from webapp.chats.intake import AttachmentRefused
from webapp.chats.projects import MAX_INSTRUCTIONS_CHARS, Project, ProjectNameError
from webapp.chats.text import message_text
from webapp.web.app_state import web
from webapp.web.attachment_forms import read_message_with_files
from webapp.web.auth import account_of, owner_of
from webapp.web.forms import FormError, byte_limit, read_fields
from webapp.web.views.responses import NO_CHAT, error_page, redirect, refuse, to_chat

NO_PROJECT = "This project does not exist. It may have been deleted."


def _to_project(request: Request, project_id: str) -> Response:
    return redirect(request, str(request.app.url_path_for("project", project_id=project_id)))


async def _project_page(
    request: Request, project: Project, *, status_code: int = 200, alert: str = ""
) -> Response:
    app = web(request)
    owner = owner_of(request)
    context: dict[str, Any] = {
        "project": project,
        "project_files": await app.store.project_files.of(owner, project.id),
        "project_chats": await app.store.projects.chats(owner, project.id),
        "projects": await app.store.projects.of(owner),
        "chats": await app.chats.recent(owner),
        "shared_ids": await app.store.shares.shared_chat_ids(owner),
        "chat": None,
        "account": account_of(request),
        "can_sign_out": app.auth.mode == "password",
        "alert": alert,
    }
    return app.templates.response("project.html", status_code=status_code, **context)


async def _field(request: Request, name: str, max_chars: int) -> str:
    fields = await read_fields(request, byte_limit(max_chars))
    if name not in fields:
        raise FormError(400, f"The form has no {name!r} field; reload the page and retry.")
    return message_text(fields[name])


async def new_project(request: Request) -> Response:
    """POST /projects (field ``name``): a new project, opened."""
    try:
        name = await _field(request, "name", 1_000)
        project = await web(request).store.projects.create(owner_of(request), name)
    except FormError as exc:
        return await refuse(request, exc.status, exc.message)
    except ProjectNameError as exc:
        return await refuse(request, 400, str(exc))
    return _to_project(request, project.id)


async def project_page(request: Request) -> Response:
    """GET /projects/{project_id}: its chats, instructions, files, rename and delete."""
    project = await web(request).store.projects.get(
        owner_of(request), request.path_params["project_id"]
    )
    if project is None:
        return error_page(request, 404, NO_PROJECT)
    return await _project_page(request, project)


async def _owned(request: Request) -> Project | None:
    return await web(request).store.projects.get(
        owner_of(request), request.path_params["project_id"]
    )


async def new_chat_in_project(request: Request) -> Response:
    """POST /projects/{project_id}/chats: a new chat in the project, opened."""
    app = web(request)
    owner = owner_of(request)
    project = await _owned(request)
    if project is None:
        return await refuse(request, 404, NO_PROJECT)
    chat = await app.chats.new_chat(owner)
    if not await app.store.projects.move(owner, chat.id, project.id):
        return await refuse(request, 404, NO_PROJECT)  # deleted meanwhile: the chat stays
    return to_chat(request, chat.id)


async def save_instructions(request: Request) -> Response:
    """POST /projects/{project_id}/instructions (field ``instructions``)."""
    project = await _owned(request)
    if project is None:
        return await refuse(request, 404, NO_PROJECT)
    try:
        text = (await _field(request, "instructions", MAX_INSTRUCTIONS_CHARS)).strip()
        await web(request).store.projects.instruct(owner_of(request), project.id, text)
    except FormError as exc:
        return await _project_page(request, project, status_code=exc.status, alert=exc.message)
    except ValueError as exc:
        return await _project_page(request, project, status_code=400, alert=str(exc))
    return _to_project(request, project.id)


async def rename_project(request: Request) -> Response:
    """POST /projects/{project_id}/rename (field ``name``)."""
    project = await _owned(request)
    if project is None:
        return await refuse(request, 404, NO_PROJECT)
    try:
        name = await _field(request, "name", 1_000)
        await web(request).store.projects.rename(owner_of(request), project.id, name)
    except FormError as exc:
        return await _project_page(request, project, status_code=exc.status, alert=exc.message)
    except ProjectNameError as exc:
        return await _project_page(request, project, status_code=400, alert=str(exc))
    return _to_project(request, project.id)


async def delete_project(request: Request) -> Response:
    """POST /projects/{project_id}/delete: the project goes; its chats stay, moved out."""
    if not await web(request).store.projects.delete(
        owner_of(request), request.path_params["project_id"]
    ):
        return await refuse(request, 404, NO_PROJECT)
    return redirect(request, str(request.app.url_path_for("home")))


async def move_chat(request: Request) -> Response:
    """POST /chats/{chat_id}/project (field ``project_id``; empty: out of every project)."""
    app = web(request)
    owner = owner_of(request)
    chat_id = request.path_params["chat_id"]
    chat = await app.chats.get(owner, chat_id)
    if chat is None:
        return await refuse(request, 404, NO_CHAT)
    try:
        fields = await read_fields(request, 16_384)
    except FormError as exc:
        return await refuse(request, exc.status, exc.message, chat=chat)
    target = fields.get("project_id", "").strip() or None
    if not await app.store.projects.move(owner, chat_id, target):
        return await refuse(request, 404, NO_PROJECT, chat=chat)
    return to_chat(request, chat_id)


async def add_files(request: Request) -> Response:
    """POST /projects/{project_id}/files (multipart, ``files``): documents every chat of
    the project can draw on (SPEC §15). A file that cannot be taken is refused by name
    with the reason, and none of the form's files is added."""
    app = web(request)
    project = await _owned(request)
    if project is None:
        return await refuse(request, 404, NO_PROJECT)
    intake = app.intake
    if intake is None:
        raise RuntimeError("the app reads no files: build it with webapp.web.create_app")
    try:
        form = await read_message_with_files(request, 1_000, intake.limits)
        if not form.uploads:
            raise FormError(400, "Choose one or more files in Attach files, then Add files.")
        new = await intake.read(form.uploads)
        image = next((f for f in new if f.text is None), None)
        if image is not None:
            raise AttachmentRefused(
                image.attachment.name,
                "project files are documents (PDF, Word or text); attach an image to a "
                "message instead",
            )
    except FormError as exc:
        return await _project_page(request, project, status_code=exc.status, alert=exc.message)
    except AttachmentRefused as exc:
        return await _project_page(request, project, status_code=400, alert=str(exc))
    if not await app.store.project_files.add(owner_of(request), project.id, new):
        return await refuse(request, 404, NO_PROJECT)  # deleted meanwhile
    return _to_project(request, project.id)


async def remove_file(request: Request) -> Response:
    """POST /projects/{project_id}/files/{file_id}/remove (field ``name``)."""
    project = await _owned(request)
    if project is None:
        return await refuse(request, 404, NO_PROJECT)
    try:
        name = await _field(request, "name", 1_000)
    except FormError as exc:
        return await _project_page(request, project, status_code=exc.status, alert=exc.message)
    files = web(request).store.project_files
    if not await files.remove(owner_of(request), project.id, request.path_params["file_id"], name):
        message = "That file is not in this project any more. Reload the page."
        return await _project_page(request, project, status_code=404, alert=message)
    return _to_project(request, project.id)
