"""`create_app`: the chat web application as a Starlette app, for the CLI or embedding.

One database holds the chats' sessions (session_id = chat id), the run
checkpoints and the chat tables: a SQLite file (WAL), the default, or a
PostgreSQL database (a ``postgresql://`` URL) that any number of app
processes share (`webapp.stores.postgres_cluster`). The lifespan opens nothing eagerly (the
stores open lazily) but resumes, before serving, every run the database says
is still owed (with other processes: that none of them holds); on shutdown it
interrupts live runs so their checkpoints resume them -- on the next start,
or with other processes, in one of them at once -- then closes the stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.authentication import AuthenticationBackend, AuthenticationError
from starlette.exceptions import HTTPException
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from webapp.chats.db import is_postgres
from webapp.chats.file_context import FileContext
from webapp.chats.intake import AttachmentLimits, Intake
from webapp.chats.limits import Limits
from webapp.chats.store import ChatStore
from webapp.chats.users import ThrottlePolicy
from webapp.config import AppConfig
from webapp.db_pools import DEFAULT_POOL_SIZE, PoolShares, shares
from webapp.mcp_servers import McpServers
from webapp.models.endpoints import ModelRegistry
from webapp.models.offline import OfflineModel
from webapp.runtime.agent import Agent
from webapp.runtime.model import Model
from webapp.stores.checkpoint import Checkpointer
from webapp.stores.cluster import Cluster, LeaseTimes
from webapp.stores.postgres_checkpoint import PostgresCheckpointer
from webapp.stores.postgres_cluster import PostgresCluster
from webapp.stores.postgres_session import PostgresSession
from webapp.stores.session import Session
from webapp.stores.sqlite_checkpoint import SQLiteCheckpointer
from webapp.stores.sqlite_session import SQLiteSession
from webapp.tools import calculator, current_time
from webapp.web.agents import ChatAgents
from webapp.web.api.service import ApiService
from webapp.web.api.views import api_routes
from webapp.web.app_state import WebApp
from webapp.web.assets import STATIC_DIR, TEMPLATES_DIR
from webapp.web.auth import (
    AuthSettings,
    NoAccounts,
    SessionCookie,
    TrustedHeader,
    TrustedHeaderGate,
)
from webapp.web.chat_models import ChatModels
from webapp.web.chat_service import ChatService
from webapp.web.forms import body_timeout
from webapp.web.fragments import Fragments
from webapp.web.gate import Gate
from webapp.web.live.lease_keeper import LeaseKeeper
from webapp.web.live.local_cluster import LocalCluster
from webapp.web.live.runs import RunManager
from webapp.web.metrics import Metrics
from webapp.web.operations import Health, Operations
from webapp.web.security import SecurityMiddleware
from webapp.web.templating import Templates, by_name
from webapp.web.views import (
    accounts,
    admin,
    api_keys,
    attachments,
    chat_files,
    chats,
    messages,
    projects,
    search,
    stream,
    tools,
)
from webapp.web.views import models as model_views
from webapp.web.views import operations as operation_views
from webapp.web.views import shares as share_views
from webapp.web.views.responses import ERROR_TITLES, http_exception

logger = logging.getLogger("webapp.web")

# How long start-up waits for the MCP servers to connect (or fail) before it resumes the
# runs it owes and serves: a run resumed sooner would find their tools missing.
TOOLS_START_SECONDS = 15.0


INSTRUCTIONS = (
    "You are a helpful assistant in a chat app. Answer in Markdown. Use the calculator "
    "tool for arithmetic instead of computing in your head, and current_time when asked "
    "about the date or time."
)


def default_agent(model: Model | None) -> Agent:
    return Agent(
        "assistant", instructions=INSTRUCTIONS, model=model, tools=[calculator, current_time]
    )


def routes(
    static_dir: str | os.PathLike[str] = STATIC_DIR, auth: AuthSettings | None = None
) -> list[Route | Mount]:
    return [
        Route("/", chats.home, methods=["GET"], name="home"),
        Route("/chats", chats.new_chat, methods=["POST"], name="new_chat"),
        Route("/chats/import", chat_files.import_chat, methods=["POST"], name="import_chat"),
        Route("/search", search.search, methods=["GET"], name="search"),
        Route("/tools", tools.tools_page, methods=["GET"], name="tools"),
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
        Route("/chats/{chat_id}/switch", messages.switch, methods=["POST"], name="switch"),
        Route("/chats/{chat_id}/runs/{run_id}/stop", messages.stop, methods=["POST"], name="stop"),
        Route(
            "/chats/{chat_id}/runs/{run_id}/decide",
            messages.decide,
            methods=["POST"],
            name="decide",
        ),
        Route(
            "/chats/{chat_id}/runs/{run_id}/continue",
            messages.continue_reply,
            methods=["POST"],
            name="continue",
        ),
        Route(
            "/chats/{chat_id}/runs/{run_id}/branch", chats.branch, methods=["POST"], name="branch"
        ),
        Route(
            "/chats/{chat_id}/runs/{run_id}/events", stream.events, methods=["GET"], name="events"
        ),
        Route("/chats/{chat_id}/rename", chats.rename, methods=["POST"], name="rename"),
        Route(
            "/chats/{chat_id}/export.md",
            chat_files.export_markdown,
            methods=["GET"],
            name="export_markdown",
        ),
        Route(
            "/chats/{chat_id}/export.json",
            chat_files.export_json,
            methods=["GET"],
            name="export_json",
        ),
        Route(
            "/chats/{chat_id}/files/{file_id}",
            attachments.download,
            methods=["GET"],
            name="attachment",
        ),
        Route(
            "/chats/{chat_id}/delete", chats.delete_confirm, methods=["GET"], name="delete_confirm"
        ),
        Route("/chats/{chat_id}/delete", chats.delete, methods=["POST"], name="delete"),
        Route(
            "/chats/{chat_id}/model", model_views.choose_model, methods=["POST"], name="chat_model"
        ),
        Route(
            "/chats/{chat_id}/instructions",
            model_views.save_instructions,
            methods=["POST"],
            name="instructions",
        ),
        Route("/chats/{chat_id}/usage", model_views.usage, methods=["GET"], name="chat_usage"),
        Route(
            "/tools/models/refresh",
            model_views.refresh_models,
            methods=["POST"],
            name="refresh_models",
        ),
        # For administrators (a --metrics-token bearer is answered before the app).
        Route("/metrics", operation_views.metrics, methods=["GET"], name="metrics"),
        Route("/api-keys", api_keys.keys_page, methods=["GET"], name="api_keys"),
        Route("/api-keys", api_keys.create_key, methods=["POST"], name="create_api_key"),
        Route(
            "/api-keys/{key_id}/revoke",
            api_keys.revoke_key,
            methods=["POST"],
            name="revoke_api_key",
        ),
        *api_routes(),
        *share_routes(),
        *project_routes(),
        *account_routes(auth or AuthSettings()),
        Mount("/static", StaticFiles(directory=static_dir), name="static"),
    ]


def share_routes() -> list[Route]:
    """Share links (SPEC §15): the owner's page and actions, and the shared page."""
    return [
        Route("/chats/{chat_id}/share", share_views.share_page, methods=["GET"], name="share_page"),
        Route("/chats/{chat_id}/share", share_views.publish, methods=["POST"], name="share"),
        Route(
            "/chats/{chat_id}/share/revoke",
            share_views.revoke,
            methods=["POST"],
            name="revoke_share",
        ),
        Route("/s/{token}", share_views.shared, methods=["GET"], name="shared"),
        Route(
            "/s/{token}/continue",
            share_views.continue_page,
            methods=["GET"],
            name="continue_shared_page",
        ),
        Route(
            "/s/{token}/continue",
            share_views.continue_shared,
            methods=["POST"],
            name="continue_shared",
        ),
    ]


def project_routes() -> list[Route]:
    """Projects (SPEC §15), and moving a chat into or out of one."""
    by_id = "/projects/{project_id}"
    return [
        Route("/projects", projects.new_project, methods=["POST"], name="new_project"),
        Route(by_id, projects.project_page, methods=["GET"], name="project"),
        Route(
            f"{by_id}/chats",
            projects.new_chat_in_project,
            methods=["POST"],
            name="new_project_chat",
        ),
        Route(
            f"{by_id}/instructions",
            projects.save_instructions,
            methods=["POST"],
            name="project_instructions",
        ),
        Route(f"{by_id}/rename", projects.rename_project, methods=["POST"], name="rename_project"),
        Route(f"{by_id}/files", projects.add_files, methods=["POST"], name="add_project_files"),
        Route(
            f"{by_id}/files/{{file_id}}/remove",
            projects.remove_file,
            methods=["POST"],
            name="remove_project_file",
        ),
        Route(f"{by_id}/delete", projects.delete_project, methods=["POST"], name="delete_project"),
        Route("/chats/{chat_id}/project", projects.move_chat, methods=["POST"], name="move_chat"),
    ]


def account_routes(auth: AuthSettings) -> list[Route]:
    """Signing in and out (password mode), and the administrators' page of users (any
    mode with accounts), SPEC §13. Without accounts there are none of these."""
    if not auth.accounts:
        return []
    by_user = "/admin/users/{user_id}"
    sign_in = [
        Route("/login", accounts.login_page, methods=["GET"], name="login"),
        Route("/login", accounts.login, methods=["POST"], name="sign_in"),
        Route("/logout", accounts.logout, methods=["POST"], name="logout"),
    ]
    return [
        *(sign_in if auth.mode == "password" else []),
        Route("/admin/users", admin.users_page, methods=["GET"], name="admin_users"),
        Route("/admin/users", admin.add_user, methods=["POST"], name="add_user"),
        Route(f"{by_user}/disable", admin.disable_user, methods=["POST"], name="disable_user"),
        Route(f"{by_user}/enable", admin.enable_user, methods=["POST"], name="enable_user"),
        Route(f"{by_user}/password", admin.reset_password, methods=["POST"], name="reset_password"),
        Route(f"{by_user}/sign-out", admin.sign_out_user, methods=["POST"], name="sign_out_user"),
    ]


def create_app(
    db_path: str | os.PathLike[str],
    *,
    model: Model | None = None,
    agent: Agent | None = None,
    models: ModelRegistry | None = None,
    max_message_chars: int = 100_000,
    token: str | None = None,
    offline_delay: float = 0.02,
    redact: Sequence[str] = (),
    max_turns: int = 20,
    allowed_hosts: Sequence[str] | None = None,
    auth: AuthSettings | None = None,
    limits: Limits | None = None,
    throttle: ThrottlePolicy | None = None,
    templates_dir: str | os.PathLike[str] = TEMPLATES_DIR,
    static_dir: str | os.PathLike[str] = STATIC_DIR,
    config: AppConfig | None = None,
    lease_seconds: float | None = None,
    metrics_token: str | None = None,
    access_log: bool = False,
    db_pool_size: int = DEFAULT_POOL_SIZE,
    api_orphan_seconds: float = 30.0,
    idempotency_hours: float = 24.0,
    attachment_limits: AttachmentLimits | None = None,
) -> Starlette:
    """The chat app over one SQLite file, or a PostgreSQL database (``db_path`` a
    ``postgresql://`` URL) shared with other processes.

    ``models``: the models a chat chooses from (`ModelRegistry.from_settings`); without
    it, just ``model``, the offline model by default. ``agent`` (its model overrides
    ``model``) defaults to an assistant with the calculator and current_time tools; each
    chat's runs get it with the chat's own model and instructions.
    ``token``: when set, every request needs it (see `webapp.web.security`).
    ``auth``: how people sign in (`webapp.web.auth`); by default the token's mode
    when ``token`` is set, else none. With ``trusted_proxies`` the app reads
    ``X-Forwarded-For``/``-Proto`` itself (uvicorn's ProxyHeadersMiddleware, inside
    the header check): serve it with uvicorn's own ``proxy_headers=False``.
    ``limits``: per-person limits on replies (`webapp.chats.limits`); ``throttle``: how
    failed sign-ins are slowed and refused (`webapp.chats.users.ThrottlePolicy`).
    ``redact``: secrets (an API key) never shown in an error message.
    ``allowed_hosts``: host names the Host header may carry (None: any).
    ``templates_dir`` / ``static_dir``: default to the installed templates and static
    files, or the checkout's (see `webapp.web.assets`).
    ``attachment_limits``: the limits on attached files and on how much of their text a
    model is sent (`webapp.chats.intake.AttachmentLimits`; the defaults without it).
    ``config``: the config file's settings (`webapp.config.load_config`): its MCP servers
    are started with the app, and their tools offered to every chat (SPEC §11).
    ``lease_seconds``: with other processes on PostgreSQL, how long a run's lease lasts
    unrenewed, which is how soon another process takes over the runs of one that died
    (`webapp.stores.cluster.LeaseTimes`; 10 s by default).
    ``metrics_token``: a bearer token that may read ``/metrics`` without an account;
    ``access_log``: one log line per request (SPEC §17, `webapp.web.operations`).
    ``db_pool_size``: on PostgreSQL, the most connections this process opens
    (`webapp.db_pools`).
    ``api_orphan_seconds``: an API run every client has left is stopped after this long;
    ``idempotency_hours``: how long an ``Idempotency-Key`` names its run (SPEC §16).
    """
    if api_orphan_seconds <= 0 or idempotency_hours <= 0:
        raise ValueError("api_orphan_seconds and idempotency_hours must be more than 0")
    lease = LeaseTimes(lease_seconds) if lease_seconds is not None else LeaseTimes()
    body_timeout()  # WEBAPP_BODY_TIMEOUT read now: a bad value stops the app at start
    if max_message_chars < 1:
        raise ValueError(f"max_message_chars must be at least 1, got {max_message_chars!r}")
    if token is not None and len(token) < 8:
        raise ValueError("the access token must be at least 8 characters long")
    if metrics_token is not None and len(metrics_token) < 16:
        raise ValueError("the metrics token must be at least 16 characters long")
    if models is None and agent is not None:
        models = ModelRegistry.single(agent.model) if agent.model else ModelRegistry()
    elif models is None:
        models = ModelRegistry.single(model or OfflineModel(delay=offline_delay))
    agent = agent or default_agent(None)  # its model: each chat's, from ``models``
    for name, folder in (("templates", templates_dir), ("static", static_dir)):
        if not Path(folder, "base.html" if name == "templates" else "app.js").is_file():
            raise FileNotFoundError(
                f"the app's {name} folder {os.fspath(folder)!r} is missing or incomplete; "
                "reinstall webapp (`pip install .`, or `pip install -e .` in a checkout), "
                f"or pass {name}_dir="
            )
    auth = auth or AuthSettings("token" if token is not None else "none")
    if (auth.mode == "token") != (token is not None):
        raise ValueError("an access token goes with auth mode 'token', and only with it")
    app = Starlette(
        routes=routes(static_dir, auth), exception_handlers={HTTPException: http_exception}
    )
    templates = Templates(templates_dir, by_name(app.routes))
    secrets = [*redact, *models.secrets()]
    pools = shares(db_pool_size)
    store = ChatStore(db_path, limits=limits, throttle=throttle, max_connections=pools.chats)
    state = _build_state(
        db_path,
        pools,
        store,
        agent,
        models,
        templates,
        max_message_chars,
        secrets,
        max_turns,
        config or AppConfig(),
        lease,
        attachment_limits or AttachmentLimits(),
    )
    api = ApiService(
        chats=state.chats,
        store=store,
        models=models,
        token=token,
        orphan_seconds=api_orphan_seconds,
        idempotency_hours=idempotency_hours,
    )
    state = dataclasses.replace(state, auth=auth, api=api)
    app.state.web = state
    app.router.lifespan_context = _lifespan(state)

    def render_error(status: int, message: str) -> str:
        return templates.render(
            "error.html", status=status, title=ERROR_TITLES.get(status, "Error"), message=message
        )

    def refused(conn: HTTPConnection, exc: AuthenticationError) -> Response:
        return HTMLResponse(render_error(403, str(exc)), status_code=403)

    # Outermost last: the header check sees the real peer, X-Forwarded-* is applied
    # next, then the host/token/origin checks, then who is asking, then what they reach.
    app.add_middleware(Gate, settings=auth, routes=app.routes)
    app.add_middleware(AuthenticationMiddleware, backend=_backend(auth, state), on_error=refused)
    app.add_middleware(
        SecurityMiddleware,
        token=token,
        render_error=render_error,
        allowed_hosts=allowed_hosts,
        public=auth.public_path,
    )
    if auth.trusted_proxies:
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=list(auth.trusted_proxies))
    if auth.mode == "header":
        app.add_middleware(TrustedHeaderGate, header=auth.header, trusted=auth.trusted_proxies)
    app.add_middleware(  # outermost: probes and scrapers have no token, cookie or account
        Operations,
        health=state.health,
        routes=app.routes,
        metrics_token=metrics_token,
        access_log=access_log,
    )
    return app


def _backend(auth: AuthSettings, state: WebApp) -> AuthenticationBackend:
    if auth.mode == "password":
        return SessionCookie(state.store.users, public=("/static/",))
    if auth.mode == "header":
        return TrustedHeader(state.store.users, auth.header)
    return NoAccounts()


def _build_state(
    db_path: str | os.PathLike[str],
    pools: PoolShares,
    store: ChatStore,
    agent: Agent,
    models: ModelRegistry,
    templates: Templates,
    max_message_chars: int,
    redact: Sequence[str],
    max_turns: int,
    config: AppConfig,
    lease: LeaseTimes,
    attachment_limits: AttachmentLimits,
) -> WebApp:
    """Every part, built bottom-up in one pass: stores, fragments, runs, chat operations."""
    secrets = [s for s in redact if s]

    def scrub(text: str) -> str:
        for secret in secrets:
            text = text.replace(secret, "[redacted]")
        return text

    session: Session
    checkpointer: Checkpointer
    cluster: Cluster
    if is_postgres(db_path):
        dsn = str(db_path)
        session = PostgresSession(dsn, max_connections=pools.session)
        checkpointer = PostgresCheckpointer(dsn, max_connections=pools.checkpoints)
        owner = uuid.uuid4().hex[:12]
        cluster = PostgresCluster(
            dsn, owner=owner, lease=lease, events=pools.events, locks=pools.locks
        )
    else:
        session = SQLiteSession(db_path, wal=True)
        checkpointer = SQLiteCheckpointer(db_path, wal=True)
        cluster = LocalCluster(store)  # this process alone
    fragments = Fragments(templates)
    chat_models = ChatModels(store=store, registry=models, agent=agent)
    servers = McpServers(config.mcp_servers) if config.mcp_servers else None
    files = FileContext(store.files, attachment_limits.context_chars)
    agents = ChatAgents(agent, servers, store, chat_models, files, attachment_limits.context_chars)
    runs = RunManager(
        agent=agent,
        agent_for=agents.chat_agent,  # its tools, grants, model and instructions
        session=session,
        checkpointer=checkpointer,
        store=store,
        fragments=fragments,
        cluster=cluster,
        redact=scrub,
        max_turns=max_turns,
    )
    metrics = Metrics()
    runs.observer = metrics

    async def waiting() -> int:
        return len(await store.approvals.paused())

    health = Health(store.ping, metrics=metrics, running=lambda: len(runs.owned()), waiting=waiting)
    return WebApp(
        chats=ChatService(store=store, session=session, checkpointer=checkpointer, runs=runs),
        runs=runs,
        templates=templates,
        fragments=fragments,
        store=store,
        session=session,
        checkpointer=checkpointer,
        keeper=LeaseKeeper(runs, cluster) if isinstance(cluster, PostgresCluster) else None,
        agents=agents,
        max_message_chars=max_message_chars,
        model_description=models.description() if models.names() else agent.name,
        models=chat_models,
        health=health,
        intake=Intake(store.files, attachment_limits),
    )


def _lifespan(state: WebApp) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Whatever started is stopped, in reverse order, whatever raised on the way up or
        # down: each stop is pushed as soon as its start is done, and one stop that raises
        # does not skip the others (AsyncExitStack runs them all, then re-raises).
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(state.models.registry.aclose)  # pooled connections
            stack.push_async_callback(state.checkpointer.close)  # type: ignore[attr-defined]
            stack.push_async_callback(state.session.close)  # type: ignore[attr-defined]
            stack.push_async_callback(state.store.close)
            if state.api is not None:
                stack.push_async_callback(state.api.close)
            swept = await state.store.sweep()
            if swept:
                logger.warning("removed %d rows of deleted chats left by an earlier process", swept)
            await state.store.backfill()
            await state.models.registry.refresh()  # bounded: an endpoint down costs seconds
            servers = state.agents.servers
            if servers is not None:
                stack.push_async_callback(servers.stop)  # after the runs: calls cancelled first
                await servers.start()
                await _connected(servers, TOOLS_START_SECONDS)
            keeper = state.keeper
            if keeper is not None:
                stack.push_async_callback(keeper.hand_over)  # after the runs were interrupted
            stack.push_async_callback(state.runs.shutdown)
            if keeper is None:
                await state.runs.recover()
            else:
                stack.push_async_callback(keeper.stop)  # first: no renewal during shutdown
                await keeper.start()  # resumes what no process holds, then keeps leases
            if state.api is not None:
                await state.api.watch_owed()  # nobody reads them yet: orphans in time
            state.health.started = True  # /readyz: ready once the database answers too
            try:
                async with state.health.metrics.sampling_loop_lag():
                    yield
            finally:
                state.health.started = False

    return lifespan


async def _connected(servers: McpServers, timeout: float) -> None:
    """Wait until every MCP server has connected or failed, ``timeout`` at most."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while starting := [n for n, s in servers.states.items() if s.status == "starting"]:
        if loop.time() >= deadline:
            logger.warning(
                "MCP servers still starting after %g s: %s", timeout, ", ".join(starting)
            )
            return
        await asyncio.sleep(0.05)
