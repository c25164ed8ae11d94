"""`python -m webapp` / the `webapp` console script: serve the chat app with uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import secrets
import sys
from collections.abc import Sequence

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


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


def allowed_hosts(host: str, token: str | None) -> list[str] | None:
    """Host names a loopback server without a token answers to (None: any).

    Without this, a web page whose domain was re-pointed at 127.0.0.1 (DNS
    rebinding) could use the app as if it were same-origin.
    """
    if token is not None or not is_loopback(host):
        return None
    return sorted({host.strip("[]").lower(), "127.0.0.1", "localhost", "::1"})


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
        help="chat database file (env WEBAPP_DB; default ./chat.db)",
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
        "--offline-delay",
        type=float,
        default=0.02,
        help="seconds between the offline model's chunks (default 0.02)",
    )
    parser.add_argument(
        "--token",
        default=env("WEBAPP_TOKEN"),
        help="access token (env WEBAPP_TOKEN); required, and generated when absent, "
        "for a non-loopback --host",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be between 0 and 65535, got {args.port}")
    if args.offline_delay < 0:
        parser.error(f"--offline-delay must be >= 0 seconds, got {args.offline_delay}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    import uvicorn

    from webapp.models.config import describe_model, model_from_settings
    from webapp.web import create_app

    try:
        model = model_from_settings(
            base_url=args.base_url,
            model=args.model,
            api_key=args.api_key,
            offline_delay=args.offline_delay,
        )
    except ValueError as exc:
        print(f"webapp: {exc}", file=sys.stderr)
        return 2
    token = resolve_token(args.host, args.token)
    try:
        app = create_app(
            args.db,
            model=model,
            token=token,
            redact=[args.api_key or ""],
            allowed_hosts=allowed_hosts(args.host, token),
        )
    except ValueError as exc:
        print(f"webapp: {exc}", file=sys.stderr)
        return 2
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"webapp: serving http://{host}:{args.port} ({describe_model(model)}, db {args.db})",
        flush=True,
    )
    if token is not None:
        print(f"webapp: open http://{host}:{args.port}/?token={token}", flush=True)
    uvicorn.run(
        app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
