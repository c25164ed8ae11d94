"""`create_app`: the chat web application as a Starlette app, for the CLI or embedding.

One SQLite file (WAL) holds the chats' sessions (session_id = chat id), the
run checkpoints and the chats table. The lifespan opens nothing eagerly (the
stores open lazily) but resumes, before serving, every run the file says is
still owed; on shutdown it interrupts live runs so their checkpoints resume
them on the next start, then closes the stores.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from webapp.models.config import describe_model, model_from_settings
from webapp.runtime.agent import Agent
from webapp.runtime.model import Model
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.stores.sqlite_session import SQLiteSession
from webapp.tools import calculator, current_time
from webapp.web import sse
from webapp.web.chats import ChatStore
from webapp.web.context import WebApp
from webapp.web.runs import RunManager
from webapp.web.security import SecurityMiddleware
from webapp.web.templating import Templates
from webapp.web.views import chats, messages
from webapp.web.views.responses import ERROR_TITLES, http_exception

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES_DIR = ROOT / "templates"
STATIC_DIR = ROOT / "static"

INSTRUCTIONS = (
    "You are a helpful assistant in a chat app. Answer in Markdown. Use the calculator "
    "tool for arithmetic instead of computing in your head, and current_time when asked "
    "about the date or time."
)


def default_agent(model: Model) -> Agent:
    return Agent(
        "assistant", instructions=INSTRUCTIONS, model=model, tools=[calculator, current_time]
    )


def routes(static_dir: str | os.PathLike[str] = STATIC_DIR) -> list[Route | Mount]:
    return [
        Route("/", chats.home, methods=["GET"], name="home"),
        Route("/chats", chats.new_chat, methods=["POST"], name="new_chat"),
        Route("/chats/{chat_id}", chats.chat_page, methods=["GET"], name="chat"),
        Route("/chats/{chat_id}/messages", messages.send, methods=["POST"], name="send"),
        Route(
            "/chats/{chat_id}/messages/{run_id}/edit",
            messages.edit_form,
            methods=["GET"],
            name="edit_form",
        ),
        Route(
            "/chats/{chat_id}/messages/{run_id}/edit", messages.edit, methods=["POST"], name="edit"
        ),
        Route(
            "/chats/{chat_id}/regenerate", messages.regenerate, methods=["POST"], name="regenerate"
        ),
        Route("/chats/{chat_id}/runs/{run_id}/stop", messages.stop, methods=["POST"], name="stop"),
        Route("/chats/{chat_id}/runs/{run_id}/events", sse.events, methods=["GET"], name="events"),
        Route("/chats/{chat_id}/rename", chats.rename, methods=["POST"], name="rename"),
        Route(
            "/chats/{chat_id}/delete", chats.delete_confirm, methods=["GET"], name="delete_confirm"
        ),
        Route("/chats/{chat_id}/delete", chats.delete, methods=["POST"], name="delete"),
        Mount("/static", StaticFiles(directory=static_dir), name="static"),
    ]


def create_app(
    db_path: str | os.PathLike[str],
    *,
    model: Model | None = None,
    agent: Agent | None = None,
    max_message_chars: int = 100_000,
    token: str | None = None,
    offline_delay: float = 0.02,
    redact: Sequence[str] = (),
    max_turns: int = 20,
    allowed_hosts: Sequence[str] | None = None,
    templates_dir: str | os.PathLike[str] = TEMPLATES_DIR,
    static_dir: str | os.PathLike[str] = STATIC_DIR,
) -> Starlette:
    """The chat app over one SQLite file.

    ``model`` defaults to the offline model; ``agent`` (overrides ``model``)
    defaults to an assistant with the calculator and current_time tools.
    ``token``: when set, every request needs it (see `webapp.web.security`).
    ``redact``: secrets (an API key) never shown in an error message.
    ``allowed_hosts``: host names the Host header may carry (None: any).
    ``templates_dir`` / ``static_dir``: default to the checkout's templates/ and static/.
    """
    if max_message_chars < 1:
        raise ValueError(f"max_message_chars must be at least 1, got {max_message_chars!r}")
    if token is not None and len(token) < 8:
        raise ValueError("the access token must be at least 8 characters long")
    if agent is None:
        model = model or model_from_settings(
            base_url=None, model=None, api_key=None, offline_delay=offline_delay
        )
        agent = default_agent(model)
    for name, folder in (("templates", templates_dir), ("static", static_dir)):
        if not Path(folder, "base.html" if name == "templates" else "app.js").is_file():
            raise FileNotFoundError(
                f"the app's {name} folder {os.fspath(folder)!r} is missing or incomplete; "
                "install the project with `pip install -e .` from its checkout, or pass "
                f"{name}_dir="
            )
    app = Starlette(routes=routes(static_dir), exception_handlers={HTTPException: http_exception})
    templates = Templates(templates_dir, app.url_path_for)
    context = _build_context(app, db_path, agent, templates, max_message_chars, redact, max_turns)
    app.state.web = context
    app.router.lifespan_context = _lifespan(context)

    def render_error(status: int, message: str) -> str:
        return templates.render(
            "error.html", status=status, title=ERROR_TITLES.get(status, "Error"), message=message
        )

    app.add_middleware(
        SecurityMiddleware, token=token, render_error=render_error, allowed_hosts=allowed_hosts
    )
    return app


def _build_context(
    app: Starlette,
    db_path: str | os.PathLike[str],
    agent: Agent,
    templates: Templates,
    max_message_chars: int,
    redact: Sequence[str],
    max_turns: int,
) -> WebApp:
    secrets = [s for s in redact if s]

    def scrub(text: str) -> str:
        for secret in secrets:
            text = text.replace(secret, "[redacted]")
        return text

    session = SQLiteSession(db_path, wal=True)
    checkpointer = SQLiteCheckpointer(db_path, wal=True)
    chat_store = ChatStore(db_path, wal=True)
    context = WebApp(
        templates=templates,
        chats=chat_store,
        session=session,
        checkpointer=checkpointer,
        runs=None,  # type: ignore[arg-type]  # set below: the manager needs the fragments
        max_message_chars=max_message_chars,
        model_description=describe_model(agent.model) if agent.model else agent.name,
    )
    context.runs = RunManager(
        agent=agent,
        session=session,
        checkpointer=checkpointer,
        chats=chat_store,
        fragments=context.fragments(),
        redact=scrub,
        max_turns=max_turns,
    )
    return context


def _lifespan(context: WebApp) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await context.runs.recover()
        try:
            yield
        finally:
            await context.runs.shutdown()
            await context.chats.close()
            await context.session.close()  # type: ignore[attr-defined]
            await context.checkpointer.close()  # type: ignore[attr-defined]
            close_model = getattr(context.runs.agent.model, "aclose", None)
            if close_model is not None:
                await close_model()  # release the endpoint's pooled connections

    return lifespan
