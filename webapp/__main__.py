"""`python -m webapp` / the `webapp` console script: serve the chat app with uvicorn."""

from __future__ import annotations

import argparse
import gc
import ipaddress
import os
import re
import secrets
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from webapp.db_pools import DEFAULT_POOL_SIZE

if TYPE_CHECKING:
    from starlette.applications import Starlette

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
# Host names a loopback-bound server answers to (plus the bound address itself).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# Addresses no packet is sent to: connecting a UDP socket to them only asks the
# kernel which local address its route would use (the machine's LAN address).
_ROUTE_PROBES = ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1"))
_HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_.-]*[a-z0-9_.])?$")


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name we cannot vouch for: treat it as reachable from outside


def resolve_token(host: str, token: str | None) -> str | None:
    """The access token to require: the one given, or a new one for a non-loopback host."""
    if token:
        return token
    return None if is_loopback(host) else secrets.token_urlsafe(24)


AUTH_MODES = ("none", "token", "password", "header")


def auth_mode(host: str, given: str | None, token: str | None) -> str:
    """``--auth`` as given; by default ``token`` when a token is given or the host is not
    loopback, else ``none`` (the app as it always was)."""
    if given:
        return given
    return "token" if token or not is_loopback(host) else "none"


def address_list(value: str) -> list[str]:
    """``--trusted-proxies``: comma-separated addresses or CIDR blocks."""
    found = [part.strip() for part in value.split(",") if part.strip()]
    for item in found:
        try:
            ipaddress.ip_network(item.strip("[]"), strict=False)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{item!r} is not an IP address or CIDR block; give e.g. 127.0.0.1/32,10.0.0.0/8"
            ) from None
    return found


def at_least_one(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {value!r}")
    return number


def positive_number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0, got {value!r}")
    return number


def lease_seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not 1.0 <= number < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds, at least 1, got {value!r}")
    return number


@dataclass(frozen=True)
class Machine:
    """This machine's own host names and addresses, as a Host header may carry them."""

    names: frozenset[str]
    addresses: frozenset[str]


def this_machine() -> Machine:
    names = {n.lower() for n in (socket.gethostname(), socket.getfqdn()) if n}
    addresses: set[str] = set()
    for name in names:
        try:
            addresses.update(str(info[4][0]) for info in socket.getaddrinfo(name, None))
        except OSError:
            pass  # a host name that does not resolve adds no address
    for family, probe in _ROUTE_PROBES:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((probe, 9))
                addresses.add(str(sock.getsockname()[0]))
        except OSError:
            pass  # no route for this family
    return Machine(frozenset(names), frozenset(a.split("%")[0].lower() for a in addresses))


def allowed_hosts(
    host: str, *, extra: Sequence[str] = (), machine: Machine | None = None
) -> list[str] | None:
    """The host names a server bound to ``host`` answers to (None: any).

    Loopback: the loopback names. A specific address or name: that, and this
    machine's host name and FQDN. 0.0.0.0 or ``::``: this machine's names and
    addresses, and the loopback names. ``extra`` (``--allowed-hosts``) adds
    names; ``*`` among them allows any. Refusing other names stops DNS
    rebinding (a foreign site's name re-pointed at this server) and keeps a
    forged Host header out of the addresses the app builds.
    """
    if "*" in extra:
        return None
    bound = host.strip("[]").lower()
    names = {bound, *(name.strip("[]").lower() for name in extra)}
    if is_loopback(bound):
        return sorted(names | set(LOOPBACK_HOSTS))
    machine = machine or this_machine()
    names |= machine.names
    if _is_unspecified(bound):
        names |= machine.addresses | set(LOOPBACK_HOSTS)
    return sorted(names)


def _is_unspecified(host: str) -> bool:
    try:
        return not host or ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def host_list(value: str) -> list[str]:
    """``--allowed-hosts``: comma-separated host names or addresses, or ``*``."""
    hosts = [part.strip().lower() for part in value.split(",") if part.strip()]
    for name in hosts:
        bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
        if name == "*" or _HOST_NAME.match(bare):
            continue
        try:
            ipaddress.ip_address(bare)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name!r} is not a host name or address; give names like app.example.com "
                "or 10.0.0.5 without scheme or port, or * for any"
            ) from None
    return hosts


LOG_LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str, log_format: str = "text") -> None:
    """Every log line with a UTC timestamp, as text or JSON (`webapp.logs`)."""
    from webapp.logs import configure_logging as configure

    configure(level, log_format)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="webapp",
        description="A chat web app whose runs are durable: stop, edit, regenerate, survive crashes.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument(
        "--db",
        default=env("WEBAPP_DB") or "chat.db",
        help="chat database: a SQLite file, or postgresql://user:password@host:port/dbname "
        "shared by any number of app processes (env WEBAPP_DB; default ./chat.db)",
    )
    parser.add_argument(
        "--model", default=env("WEBAPP_MODEL"), help="model name (env WEBAPP_MODEL)"
    )
    parser.add_argument(
        "--base-url",
        default=env("OPENAI_BASE_URL"),
        help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:11434/v1 (env OPENAI_BASE_URL); "
        "without it the offline model answers",
    )
    parser.add_argument("--api-key", default=env("OPENAI_API_KEY"), help="env OPENAI_API_KEY")
    parser.add_argument(
        "--config",
        default=env("WEBAPP_CONFIG"),
        metavar="FILE",
        help="the TOML config file: model endpoints and presets, MCP servers "
        "(env WEBAPP_CONFIG; see README)",
    )
    parser.add_argument(
        "--offline-delay",
        type=float,
        default=0.02,
        help="seconds between the offline model's chunks (default 0.02)",
    )
    parser.add_argument(
        "--token",
        default=env("WEBAPP_TOKEN"),
        help="with --auth token (the default for a non-loopback --host): the access token "
        "(env WEBAPP_TOKEN); generated when absent",
    )
    parser.add_argument(
        "--allowed-hosts",
        type=host_list,
        default=env("WEBAPP_ALLOWED_HOSTS") or "",
        metavar="NAMES",
        help="comma-separated host names or addresses the server also answers to, besides "
        "those of --host, e.g. a DNS name or the name a proxy forwards; * for any "
        "(env WEBAPP_ALLOWED_HOSTS)",
    )
    parser.add_argument(
        "--auth",
        default=env("WEBAPP_AUTH") or None,
        metavar="MODE",
        help="how people get in: none, token, password (accounts: `webapp users add`) or "
        "header (a signing-in proxy names them; needs --trusted-proxies) (env WEBAPP_AUTH; "
        "default none on loopback, token elsewhere)",
    )
    parser.add_argument(
        "--auth-header",
        default=env("WEBAPP_AUTH_HEADER") or "X-Forwarded-User",
        metavar="NAME",
        help="with --auth header: the header naming the person (env WEBAPP_AUTH_HEADER; "
        "default X-Forwarded-User)",
    )
    parser.add_argument(
        "--trusted-proxies",
        type=address_list,
        default=env("WEBAPP_TRUSTED_PROXIES") or "",
        metavar="CIDRS",
        help="comma-separated addresses or CIDR blocks of the proxies in front of the app: "
        "only their X-Forwarded-For/-Proto (and --auth-header) count "
        "(env WEBAPP_TRUSTED_PROXIES; default none)",
    )
    parser.add_argument(
        "--share-links",
        default=env("WEBAPP_SHARE_LINKS") or "signed-in",
        choices=("off", "signed-in", "anyone"),
        help="who may open a chat's share link: off (no sharing), signed-in (anyone who "
        "may use the app; under --auth none everyone who reaches it) or anyone "
        "(env WEBAPP_SHARE_LINKS; default signed-in)",
    )
    parser.add_argument(
        "--max-runs-per-user",
        type=at_least_one,
        default=env("WEBAPP_MAX_RUNS_PER_USER") or None,
        metavar="N",
        help="replies one person may have running at once (env WEBAPP_MAX_RUNS_PER_USER)",
    )
    parser.add_argument(
        "--max-tokens-per-day",
        type=at_least_one,
        default=env("WEBAPP_MAX_TOKENS_PER_DAY") or None,
        metavar="N",
        help="tokens (in + out) one person's replies may use per UTC day "
        "(env WEBAPP_MAX_TOKENS_PER_DAY)",
    )
    parser.add_argument(
        "--lease-seconds",
        type=lease_seconds,
        default=env("WEBAPP_LEASE_SECONDS") or None,
        metavar="SECONDS",
        help="with several processes on PostgreSQL: how long a run's lease lasts unrenewed, "
        "i.e. how soon another process resumes the runs of one that died "
        "(env WEBAPP_LEASE_SECONDS; default 10)",
    )
    parser.add_argument(
        "--api-orphan-seconds",
        type=positive_number,
        default=env("WEBAPP_API_ORPHAN_SECONDS") or "30",
        metavar="SECONDS",
        help="an API run that every client has left is stopped after this long "
        "(env WEBAPP_API_ORPHAN_SECONDS; default 30)",
    )
    parser.add_argument(
        "--idempotency-hours",
        type=positive_number,
        default=env("WEBAPP_IDEMPOTENCY_HOURS") or "24",
        metavar="HOURS",
        help="how long an API request's Idempotency-Key names its run "
        "(env WEBAPP_IDEMPOTENCY_HOURS; default 24)",
    )
    parser.add_argument(
        "--max-attachment-mb",
        type=positive_number,
        default=env("WEBAPP_MAX_ATTACHMENT_MB") or "20",
        metavar="MB",
        help="the largest file a message may attach (env WEBAPP_MAX_ATTACHMENT_MB; default 20)",
    )
    parser.add_argument(
        "--max-pdf-pages",
        type=at_least_one,
        default=env("WEBAPP_MAX_PDF_PAGES") or "2000",
        metavar="N",
        help="the most pages an attached PDF may have (env WEBAPP_MAX_PDF_PAGES; default 2000)",
    )
    parser.add_argument(
        "--attachment-context-chars",
        type=at_least_one,
        default=env("WEBAPP_ATTACHMENT_CONTEXT_CHARS") or "60000",
        metavar="N",
        help="a message's documents go to the model whole up to this many characters, as "
        "their most relevant excerpts beyond (env WEBAPP_ATTACHMENT_CONTEXT_CHARS; "
        "default 60000)",
    )
    parser.add_argument(
        "--log-level",
        default=env("WEBAPP_LOG_LEVEL") or "info",
        choices=LOG_LEVELS,
        help="the app's own log level (env WEBAPP_LOG_LEVEL; default info: one line per "
        "run); libraries log warnings and worse unless this is debug",
    )
    _operations_arguments(parser, env)
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be between 0 and 65535, got {args.port}")
    if args.offline_delay < 0:
        parser.error(f"--offline-delay must be >= 0 seconds, got {args.offline_delay}")
    _check_auth(parser, args)
    return args


def _operations_arguments(parser: argparse.ArgumentParser, env: Any) -> None:
    """Logs, metrics and the database's connections (SPEC §17)."""
    parser.add_argument(
        "--log-format",
        default=env("WEBAPP_LOG_FORMAT") or "text",
        choices=("text", "json"),
        help="log lines as text or as one JSON object each; every line has a UTC "
        "timestamp (env WEBAPP_LOG_FORMAT; default text)",
    )
    parser.add_argument(
        "--access-log",
        action="store_true",
        default=env("WEBAPP_ACCESS_LOG", "") not in ("", "0", "false"),
        help="log one line per request: client, method, path, status, time "
        "(env WEBAPP_ACCESS_LOG=1)",
    )
    parser.add_argument(
        "--metrics-token",
        default=env("WEBAPP_METRICS_TOKEN") or None,
        metavar="TOKEN",
        help="a bearer token (16 characters or more) with which a scraper may read "
        "/metrics; administrators may anyway (env WEBAPP_METRICS_TOKEN)",
    )
    parser.add_argument(
        "--db-pool-size",
        type=at_least_one,
        default=env("WEBAPP_DB_POOL_SIZE") or DEFAULT_POOL_SIZE,
        metavar="N",
        help="with PostgreSQL: the most connections this process opens "
        f"(env WEBAPP_DB_POOL_SIZE; default {DEFAULT_POOL_SIZE})",
    )


def _check_auth(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.auth is not None and args.auth not in AUTH_MODES:
        parser.error(f"--auth must be one of {', '.join(AUTH_MODES)}, got {args.auth!r}")
    args.auth = auth_mode(args.host, args.auth, args.token)
    if args.auth == "none" and not is_loopback(args.host):
        parser.error(
            f"--auth none on {args.host} would let anyone who reaches it in; "
            "use token, password or header"
        )
    if args.token and args.auth != "token":
        parser.error(f"--token (or WEBAPP_TOKEN) goes with --auth token, not --auth {args.auth}")
    if args.auth == "header" and not args.trusted_proxies:
        parser.error(
            "--auth header needs --trusted-proxies (the addresses of the proxy that signs "
            "people in): a header from anywhere else would let anyone in"
        )


def _has_accounts(db: str) -> bool:
    import asyncio

    from webapp.chats.store import ChatStore

    async def look() -> bool:
        async with ChatStore(db) as store:
            return bool(await store.users.everyone())

    return asyncio.run(look())


def _serve(app: Starlette, host: str, port: int) -> None:
    """Run ``app`` under uvicorn. At SIGINT/SIGTERM sse-starlette ends the open event
    streams at once (it watches uvicorn's exit), so the graceful shutdown does not wait
    its whole timeout on them, and the browsers reconnect to whichever process serves
    next. uvicorn's own X-Forwarded-* handling is off (it would trust 127.0.0.1): the
    app applies it itself, for --trusted-proxies only, after its header check has seen
    each connection's real peer (`webapp.web.create_app`)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=5,
        proxy_headers=False,
        log_config=None,  # its lines go through the app's handler: UTC timestamps, JSON
        access_log=False,  # --access-log is the app's own (webapp.web.operations)
    )
    # What is built by now (modules, the app, its routes and templates) lives as long as
    # the process: frozen out of the collector's sight, a full collection while replies
    # stream walks only what came after (a bench/framework.py row's few per cent).
    gc.collect()
    gc.freeze()
    uvicorn.Server(config).run()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["import"], ["users"]):
        from webapp import commands

        run = commands.import_file if argv[0] == "import" else commands.users_command
        return run(argv[1:])
    args = parse_args(argv)
    configure_logging(args.log_level, args.log_format)

    from webapp.chats.intake import AttachmentLimits
    from webapp.chats.limits import Limits
    from webapp.config import ConfigError, load_config
    from webapp.models.endpoints import ModelRegistry
    from webapp.stores.postgres import redact_dsn
    from webapp.web import create_app
    from webapp.web.auth import AuthSettings

    try:
        config = load_config(args.config)
        models = ModelRegistry.from_settings(
            config.endpoints,
            base_url=args.base_url,
            model=args.model,
            api_key=args.api_key,
            offline_delay=args.offline_delay,
            presets=config.presets,
        )
    except (ConfigError, ValueError) as exc:
        print(f"webapp: {exc}", file=sys.stderr)
        return 2
    token = (args.token or secrets.token_urlsafe(24)) if args.auth == "token" else None
    try:
        app = create_app(
            args.db,
            models=models,
            token=token,
            redact=[args.api_key or ""],
            allowed_hosts=allowed_hosts(args.host, extra=args.allowed_hosts),
            config=config,
            auth=AuthSettings(
                args.auth, args.auth_header, tuple(args.trusted_proxies), args.share_links
            ),
            limits=Limits(args.max_runs_per_user, args.max_tokens_per_day),
            lease_seconds=args.lease_seconds,
            metrics_token=args.metrics_token,
            access_log=args.access_log,
            db_pool_size=args.db_pool_size,
            api_orphan_seconds=args.api_orphan_seconds,
            idempotency_hours=args.idempotency_hours,
            attachment_limits=AttachmentLimits(
                max_mb=args.max_attachment_mb,
                max_pdf_pages=args.max_pdf_pages,
                context_chars=args.attachment_context_chars,
            ),
        )
    except ValueError as exc:
        print(f"webapp: {exc}", file=sys.stderr)
        return 2
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"webapp: serving http://{host}:{args.port} "
        f"({models.description()}, db {redact_dsn(args.db)})",
        flush=True,
    )
    if token is not None:
        print(f"webapp: open http://{host}:{args.port}/?token={token}", flush=True)
    if args.auth == "password" and not _has_accounts(args.db):
        print(
            "webapp: no accounts yet; add one with `python -m webapp users add NAME --admin`",
            file=sys.stderr,
            flush=True,
        )
    _serve(app, args.host, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
