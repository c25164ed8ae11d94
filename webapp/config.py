"""The app's config file (``--config FILE`` / ``WEBAPP_CONFIG``): TOML, read with `tomllib`.

It lists the MCP servers whose tools the model may call (SPEC §11), and the
model endpoints and presets a chat chooses from (SPEC §12). Every mistake is
reported at start-up with the file, the table and the key, so a typo never
turns into a server, an endpoint or a preset that silently does nothing. ``${NAME}`` in
``env``, ``headers``, ``args`` and ``url`` is taken from the app's environment,
so secrets stay out of the file; a missing variable is an error, not an empty
string.
"""

from __future__ import annotations

import os
import re
import tomllib
import unicodedata
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
class EndpointConfig:
    """One ``[[endpoints]]`` table: an OpenAI-compatible server and the models it offers."""

    name: str
    base_url: str
    api_key_env: str | None = None  # the environment variable holding the key
    api_key: str | None = field(default=None, repr=False)  # its value, read at start
    models: tuple[str, ...] | None = None  # None: GET {base_url}/models lists them


@dataclass(frozen=True)
class PresetConfig:
    """One ``[[presets]]`` table: what a new chat starts with when the preset is chosen."""

    name: str
    model: str  # endpoint/model
    instructions: str = ""
    temperature: float | None = None
    max_tokens: int | None = None


@dataclass(frozen=True)
class AppConfig:
    mcp_servers: tuple[McpServerConfig, ...] = ()
    endpoints: tuple[EndpointConfig, ...] = ()
    presets: tuple[PresetConfig, ...] = ()


def load_config(
    path: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None
) -> AppConfig:
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


_TOP_KEYS = ("endpoints", "mcp_servers", "presets")


def parse_config(data: Mapping[str, Any], *, where: str, environ: Mapping[str, str]) -> AppConfig:
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        known = ", ".join(_TOP_KEYS)
        raise ConfigError(f"{where}: unknown table or key {unknown[0]!r} (known: {known})")
    servers = data.get("mcp_servers", {})
    if not isinstance(servers, dict):
        raise ConfigError(f"{where}: mcp_servers must be a table of [mcp_servers.NAME] tables")
    parsed = tuple(
        _server(name, table, f"{where}: [mcp_servers.{name}]", environ)
        for name, table in servers.items()
    )
    endpoints = tuple(
        _endpoint(table, f"{where}: [[endpoints]] #{number}", environ)
        for number, table in enumerate(_array(data, "endpoints", where), 1)
    )
    _unique([e.name for e in endpoints], f"{where}: [[endpoints]]", "an endpoint's name")
    presets = tuple(
        _preset(table, f"{where}: [[presets]] #{number}", endpoints)
        for number, table in enumerate(_array(data, "presets", where), 1)
    )
    _unique([p.name for p in presets], f"{where}: [[presets]]", "a preset's name")
    return AppConfig(mcp_servers=parsed, endpoints=endpoints, presets=presets)


_SERVER_KEYS = {"command", "args", "env", "cwd", "url", "headers", "approval", "tools", "timeout"}


def _server(name: str, table: Any, where: str, environ: Mapping[str, str]) -> McpServerConfig:
    if not _SERVER_NAME.fullmatch(name):
        raise ConfigError(f"{where}: a server's name is 1-32 letters, digits, '-' or '_'")
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(table) - _SERVER_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_SERVER_KEYS))})"
        )
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
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= 86400
    ):
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
        approval=_policy(table["approval"], where, "approval", ("allow", "ask"))
        if "approval" in table
        else None,
        tools=_tool_policies(table.get("tools", {}), where),
        timeout=float(timeout),
    )


def _array(data: Mapping[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    tables = data.get(key, [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{where}: {key} must be an array of tables, written [[{key}]]")
    return tables


def _unique(names: list[str], where: str, what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"{where}: {what} must be unique, and {name!r} is given twice")
        seen.add(name)


_ENDPOINT_KEYS = {"name", "base_url", "api_key_env", "models"}
MAX_MODEL_ID_CHARS = 200
# Control characters, and format ones (a right-to-left override, a zero-width space):
# a name that holds one shows as something it is not.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})


def model_id_problem(name: str) -> str | None:
    """Why ``name`` (stripped) cannot be a model's name, or None when it can."""
    if not name:
        return "is blank"
    if len(name) > MAX_MODEL_ID_CHARS:
        return f"is longer than {MAX_MODEL_ID_CHARS} characters"
    hidden = next((c for c in name if unicodedata.category(c) in _HIDDEN), None)
    if hidden is not None:
        return f"holds the invisible or control character U+{ord(hidden):04X}"
    return None


def _model_names(models: object, where: str) -> list[str]:
    """The ``models`` list, each name stripped; ConfigError names every bad one."""
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise ConfigError(f"{where}: models must be a list of model names (strings)")
    if not models:
        raise ConfigError(f"{where}: models is empty; leave it out to ask GET /models")
    names = [m.strip() for m in models]
    problems = []
    for index, name in enumerate(names):
        problem = model_id_problem(name)
        if problem is not None:
            problems.append(f"models[{index}] ({models[index]!r}) {problem}")
    twice = sorted({n for n in names if n and names.count(n) > 1})
    if twice:
        problems.append(
            "a name must be unique, and " + ", ".join(repr(n) for n in twice) + " is given twice"
        )
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems))
    return names


def _endpoint(table: dict[str, Any], where: str, environ: Mapping[str, str]) -> EndpointConfig:
    _known_keys(table, _ENDPOINT_KEYS, where)
    name = _string(table.get("name"), where, "name")
    where = f"{where} ({name})"
    if not _SERVER_NAME.fullmatch(name):
        raise ConfigError(f"{where}: an endpoint's name is 1-32 letters, digits, '-' or '_'")
    base_url = _string(table.get("base_url"), where, "base_url").strip().rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"{where}: base_url must start with http:// or https://, such as "
            f"'http://127.0.0.1:8080/v1', got {base_url!r}"
        )
    key_env, key = table.get("api_key_env"), None
    if key_env is not None:
        key_env = _string(key_env, where, "api_key_env")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_env):
            raise ConfigError(f"{where}: api_key_env must name an environment variable")
        if key_env not in environ:
            raise ConfigError(f"{where}: api_key_env names {key_env}, which is not set")
        key = environ[key_env]
    models = table.get("models")
    if models is not None:
        models = _model_names(models, where)
    return EndpointConfig(
        name, base_url, key_env, key, tuple(models) if models is not None else None
    )


_PRESET_KEYS = {"name", "model", "instructions", "temperature", "max_tokens"}


def _preset(
    table: dict[str, Any], where: str, endpoints: tuple[EndpointConfig, ...]
) -> PresetConfig:
    _known_keys(table, _PRESET_KEYS, where)
    name = " ".join(_string(table.get("name"), where, "name").split())
    if not 0 < len(name) <= 80:
        raise ConfigError(f"{where}: a preset's name is 1-80 characters")
    where = f"{where} ({name})"
    model = _string(table.get("model"), where, "model")
    endpoint, _, model_name = model.partition("/")
    if not endpoint or not model_name:
        raise ConfigError(f"{where}: model is endpoint/model, such as 'local/qwen2.5-7b'")
    listed = next((e.models for e in endpoints if e.name == endpoint), None)
    if listed is not None and model_name not in listed:
        raise ConfigError(f"{where}: model {model_name!r} is not in endpoint {endpoint}'s models")
    instructions = _string(table.get("instructions", ""), where, "instructions")
    temperature = table.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not 0 <= temperature <= 2
    ):
        raise ConfigError(f"{where}: temperature must be a number from 0 to 2")
    max_tokens = table.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise ConfigError(f"{where}: max_tokens must be a whole number of tokens, at least 1")
    return PresetConfig(
        name,
        model,
        instructions,
        float(temperature) if temperature is not None else None,
        max_tokens,
    )


def _known_keys(table: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        known_keys = ", ".join(sorted(known))
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {known_keys})")


def _tool_policies(table: Any, where: str) -> dict[str, Policy]:
    if not isinstance(table, dict):
        raise ConfigError(f'{where}: tools must be a table of tool = "ask" | "allow" | "deny"')
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
            raise ConfigError(
                f"{where}: {key} uses ${{{name}}}, which is not set in the environment"
            )
        return environ[name]

    return _VARIABLE.sub(substitute, value)
