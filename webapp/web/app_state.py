"""`WebApp`: the parts every view reaches through ``request.app.state.web``.

Built once, in one pass, by `webapp.web.app.create_app`; nothing in it is
patched afterwards.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.requests import Request

from webapp.chats.intake import Intake
from webapp.chats.store import ChatStore
from webapp.stores.checkpoint import Checkpointer
from webapp.stores.session import Session
from webapp.web.agents import ChatAgents
from webapp.web.auth import AuthSettings
from webapp.web.chat_models import ChatModels
from webapp.web.chat_service import ChatService
from webapp.web.fragments import Fragments
from webapp.web.live.lease_keeper import LeaseKeeper
from webapp.web.live.runs import RunManager
from webapp.web.operations import Health
from webapp.web.templating import Templates

if TYPE_CHECKING:  # the API's service imports the views' helpers, which import this
    from webapp.web.api.service import ApiService


@dataclass(frozen=True)
class WebApp:
    chats: ChatService  # every chat operation goes through here
    runs: RunManager  # live runs, read by the SSE endpoint
    templates: Templates
    fragments: Fragments
    store: ChatStore
    session: Session
    checkpointer: Checkpointer
    keeper: LeaseKeeper | None  # several processes on PostgreSQL (stores.postgres_cluster)
    agents: ChatAgents  # each chat's agent: built-in tools, MCP servers, grants
    max_message_chars: int
    model_description: str
    models: ChatModels  # each chat's model and instructions, and the models on offer
    health: Health  # readiness and the metrics (SPEC §17, webapp.web.operations)
    auth: AuthSettings = field(default_factory=AuthSettings)  # who may sign in, and how
    api: ApiService | None = None  # the OpenAI-compatible API (SPEC §16)
    intake: Intake | None = None  # reads the files a message brings (SPEC §14)


def web(request: Request) -> WebApp:
    found = getattr(request.app.state, "web", None)
    if not isinstance(found, WebApp):
        raise TypeError(
            "request.app.state.web is missing: build the app with webapp.web.create_app"
        )
    return found


def new_client_id() -> str:
    """A fresh id for the next message a form sends (the idempotency key of a send)."""
    return uuid.uuid4().hex
