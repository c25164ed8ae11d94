"""The app's config file (``--config FILE`` / ``WEBAPP_CONFIG``): TOML, read with `tomllib`.

It lists the MCP servers whose tools the model may call (SPEC §11). Every
mistake is reported at start-up with the file, the table and the key, so a
typo never turns into a server that silently does nothing. ``${NAME}`` in
``env``, ``headers``, ``args`` and ``url`` is taken from the app's environment,
so secrets stay out of the file; a missing variable is an error, not an empty
string.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Policy = Literal["allow", "ask", "deny"]
POLICIES: tuple[str, ...] = ("allow", "ask", "deny")

_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_TIMEOUT = 60.0


class ConfigError(ValueError):
    """The config file is wrong; the message names the file, the table and the key."""


@dataclass(frozen=True)
class McpServerConfig:
    """One ``[mcp_servers.NAME]`` table: a stdio command or a Streamable HTTP URL."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    approval: Policy | None = None  # the server's default; None: from each tool's annotations
    tools: Mapping[str, Policy] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"


@dataclass(frozen=True)
class AppConfig:
    mcp_servers: tuple[McpServerConfig, ...] = ()


def load_config(path: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> AppConfig:
    """The config at ``path`` (None: an empty config); raises `ConfigError`."""
    if path is None:
        return AppConfig()
    source = Path(path)
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {source} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {source} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {source} is not valid TOML: {exc}") from None
    return parse_config(data, where=str(source), environ=os.environ if environ is None else environ)


def parse_config(data: Mapping[str, Any], *, where: str, environ: Mapping[str, str]) -> AppConfig:
    unknown = sorted(set(data) - {"mcp_servers"})
    if unknown:
        raise ConfigError(f"{where}: unknown table or key {unknown[0]!r} (known: mcp_servers)")
    servers = data.get("mcp_servers", {})
    if not isinstance(servers, dict):
        raise ConfigError(f"{where}: mcp_servers must be a table of [mcp_servers.NAME] tables")
    parsed = tuple(
        _server(name, table, f"{where}: [mcp_servers.{name}]", environ)
        for name, table in servers.items()
    )
    return AppConfig(mcp_servers=parsed)


_SERVER_KEYS = {"command", "args", "env", "cwd", "url", "headers", "approval", "tools", "timeout"}


def _server(name: str, table: Any, where: str, environ: Mapping[str, str]) -> McpServerConfig:
    if not _SERVER_NAME.fullmatch(name):
        raise ConfigError(f"{where}: a server's name is 1-32 letters, digits, '-' or '_'")
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(table) - _SERVER_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_SERVER_KEYS))})")
    command, url = table.get("command"), table.get("url")
    if (command is None) == (url is None):
        raise ConfigError(f"{where}: give either command (a stdio server) or url (Streamable HTTP)")
    if command is not None and not (isinstance(command, str) and command.strip()):
        raise ConfigError(f"{where}: command must be a non-empty string")
    if url is not None:
        url = _expand(_string(url, where, "url"), where, "url", environ)
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}: url must start with http:// or https://, got {url!r}")
    for key in ("args", "env", "cwd") if url is not None else ("headers",):
        if key in table:
            kind = "stdio" if key == "headers" else "HTTP"
            raise ConfigError(f"{where}: {key} does not apply to a {kind} server")
    args = table.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{where}: args must be a list of strings")
    timeout = table.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 86400:
        raise ConfigError(f"{where}: timeout must be a number of seconds between 0 and 86400")
    cwd = table.get("cwd")
    return McpServerConfig(
        name=name,
        command=command,
        args=tuple(_expand(a, where, "args", environ) for a in args),
        env=_strings(table.get("env", {}), where, "env", environ),
        cwd=_string(cwd, where, "cwd") if cwd is not None else None,
        url=url,
        headers=_strings(table.get("headers", {}), where, "headers", environ),
        approval=_policy(table["approval"], where, "approval", ("allow", "ask")) if "approval" in table else None,
        tools=_tool_policies(table.get("tools", {}), where),
        timeout=float(timeout),
    )


def _tool_policies(table: Any, where: str) -> dict[str, Policy]:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: tools must be a table of tool = \"ask\" | \"allow\" | \"deny\"")
    return {name: _policy(value, where, f"tools.{name}", POLICIES) for name, value in table.items()}


def _policy(value: Any, where: str, key: str, allowed: tuple[str, ...]) -> Policy:
    if value not in allowed:
        choices = " | ".join(f'"{a}"' for a in allowed)
        raise ConfigError(f"{where}: {key} must be {choices}, got {value!r}")
    return value  # type: ignore[no-any-return]


def _string(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string, got {value!r}")
    return value


def _strings(table: Any, where: str, key: str, environ: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise ConfigError(f"{where}: {key} must be a table of strings")
    return {k: _expand(v, where, f"{key}.{k}", environ) for k, v in table.items()}


def _expand(value: str, where: str, key: str, environ: Mapping[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise ConfigError(f"{where}: {key} uses ${{{name}}}, which is not set in the environment")
        return environ[name]

    return _VARIABLE.sub(substitute, value)
