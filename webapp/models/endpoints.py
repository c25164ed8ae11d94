"""The models a chat can choose from: every model of every endpoint, named ``endpoint/model``.

The config file's ``[[endpoints]]`` (SPEC §12), the ``--base-url``/``--model``
shortcut (an endpoint named ``default``), or, with neither, the offline model
(``offline/offline``). Invariants, each named for the failure it prevents:
- a model is built once per name and parameters, and reused: its pooled
  connections serve every chat that uses it, instead of a handshake per run;
- an endpoint that is down or lists nothing costs the app only its own models:
  the reason is logged and kept for the Tools page's **Models** section, and a
  chat that chose one of them gets a run that fails saying why, never a
  silently different model;
- asking an endpoint for its models (``GET {base_url}/models``) is bounded in
  time, bytes and count, and parsed off the event loop (`webapp.models.model_list`),
  so an endpoint that never answers, or answers too much, cannot hold up the app.

Each process asks on its own: with several processes, a Refresh reaches the one
that serves it (the others ask again when they restart).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

from webapp.config import EndpointConfig, PresetConfig
from webapp.errors import ModelError
from webapp.models.attached import WithAttachments
from webapp.models.config import describe_model, model_from_settings
from webapp.models.long_results import CutLongResults
from webapp.models.model_list import list_models
from webapp.models.model_list import models_url as _models_url
from webapp.models.model_list import public_url as _public
from webapp.models.offline import OfflineModel
from webapp.models.openai_chat import OpenAIChatModel
from webapp.runtime.model import Model, ModelPart, ModelRequest

logger = logging.getLogger("webapp.models.endpoints")

OFFLINE_NAME = "offline/offline"
DEFAULT_ENDPOINT = "default"  # the --base-url/--model shortcut
DISCOVERY_TIMEOUT = 5.0  # seconds for one endpoint's GET /models, connecting included


@dataclass(frozen=True)
class Parameters:
    """What a chat may set beside its model (from a preset); None: the endpoint's default."""

    temperature: float | None = None
    max_tokens: int | None = None


class NamedModel:
    """A model under the name a chat knows it by; it streams as the model it holds."""

    def __init__(self, name: str, model: Model) -> None:
        self.name = name
        self.model = model

    def __repr__(self) -> str:
        return f"NamedModel({self.name!r}, {self.model!r})"

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        return self.model.stream(request)  # the model's own iterator: nothing per token here


def model_name(model: Model | None) -> str | None:
    """The ``endpoint/model`` name of a model from a registry (None for any other)."""
    while isinstance(model, (CutLongResults, WithAttachments)):
        model = model.model
    return model.name if isinstance(model, NamedModel) else None


class UnavailableModel:
    """Stands in for a model no endpoint offers right now: a run with it fails, saying why."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelPart]:
        raise ModelError(f"the model {self.name} is not available: {self.reason}")
        yield  # an async generator, like every model's stream  # pragma: no cover


@dataclass(frozen=True)
class EndpointStatus:
    """One endpoint as the Tools page shows it."""

    name: str
    base_url: str  # without credentials
    models: tuple[str, ...]
    listed: bool  # the config lists its models (it is not asked)
    error: str | None  # why its models are missing, when they are
    checked_at: float | None  # when it was last asked


@dataclass
class _Endpoint:
    config: EndpointConfig
    models: tuple[str, ...] = ()
    error: str | None = None
    checked_at: float | None = None
    built: dict[tuple[str, Parameters], OpenAIChatModel] = field(default_factory=dict)


class ModelRegistry:
    """Every model a chat can choose, by ``endpoint/model`` name, built on first use.

    ``fixed``: models given whole (the offline model, or one an embedding app
    passes), by name; parameters do not apply to them.
    """

    def __init__(
        self,
        endpoints: Sequence[EndpointConfig] = (),
        *,
        fixed: Mapping[str, Model] | None = None,
        presets: Sequence[PresetConfig] = (),
        timeout: float = DISCOVERY_TIMEOUT,
    ) -> None:
        self._endpoints = {e.name: _Endpoint(e, e.models or ()) for e in endpoints}
        self._fixed = {name: NamedModel(name, model) for name, model in (fixed or {}).items()}
        self.presets = tuple(presets)
        self.timeout = timeout
        self._refreshing: asyncio.Future[list[None]] | None = None
        for preset in self.presets:
            endpoint = preset.model.partition("/")[0]
            if endpoint not in self._endpoints and preset.model not in self._fixed:
                raise ValueError(
                    f"preset {preset.name!r} uses the model {preset.model}, but no endpoint "
                    f"named {endpoint!r} is configured"
                )

    @classmethod
    def from_settings(
        cls,
        endpoints: Sequence[EndpointConfig] = (),
        *,
        base_url: str | None,
        model: str | None,
        api_key: str | None,
        offline_delay: float = 0.02,
        presets: Sequence[PresetConfig] = (),
    ) -> ModelRegistry:
        """The registry the CLI's settings and config file describe; ValueError names the
        setting to fix."""
        shortcut = model_from_settings(
            base_url=base_url, model=model, api_key=api_key, offline_delay=offline_delay
        )
        if isinstance(shortcut, OfflineModel) and not endpoints:
            return cls(fixed={OFFLINE_NAME: shortcut}, presets=presets)
        configured = list(endpoints)
        if isinstance(shortcut, OpenAIChatModel):
            if any(e.name == DEFAULT_ENDPOINT for e in configured):
                raise ValueError(
                    f"--base-url makes an endpoint named {DEFAULT_ENDPOINT!r}, and the config "
                    "file has one too: rename that one, or leave --base-url out"
                )
            default = EndpointConfig(
                DEFAULT_ENDPOINT, shortcut.base_url, api_key=api_key, models=(shortcut.model,)
            )
            configured.insert(0, default)
        registry = cls(configured, presets=presets)
        if isinstance(shortcut, OpenAIChatModel):  # built already: the first chat reuses it
            registry._endpoints[DEFAULT_ENDPOINT].built[(shortcut.model, Parameters())] = shortcut
        return registry

    @classmethod
    def single(cls, model: Model) -> ModelRegistry:
        """One model given whole, as `create_app(model=...)` takes it."""
        if isinstance(model, OfflineModel):
            return cls(fixed={OFFLINE_NAME: model})
        if isinstance(model, OpenAIChatModel):
            return cls(fixed={f"{DEFAULT_ENDPOINT}/{model.model}": model})
        return cls(fixed={f"{DEFAULT_ENDPOINT}/{type(model).__name__.lower()}": model})

    # --- what a chat can choose --------------------------------------------------------

    def names(self) -> list[str]:
        """Every model on offer now, as ``endpoint/model``, in the config's order."""
        names = [f"{e.config.name}/{m}" for e in self._endpoints.values() for m in e.models]
        return names + list(self._fixed)

    @property
    def default(self) -> str | None:
        """The model of a chat that chose none: the first on offer."""
        names = self.names()
        return names[0] if names else None

    def preset(self, name: str) -> PresetConfig | None:
        return next((p for p in self.presets if p.name == name), None)

    def model(self, name: str | None, parameters: Parameters = Parameters()) -> NamedModel:
        """The model called ``name`` (the default for None), built once per parameters;
        one that is not on offer is an `UnavailableModel` under that name."""
        name = name or self.default
        if name is None:
            reason = "no endpoint offers a model; see the Models section of the Tools page"
            return NamedModel("none", UnavailableModel("none", reason))
        if name in self._fixed:
            return self._fixed[name]
        endpoint_name, _, model = name.partition("/")
        endpoint = self._endpoints.get(endpoint_name)
        if endpoint is None:
            reason = f"no endpoint named {endpoint_name!r} is configured; choose another model"
            return NamedModel(name, UnavailableModel(name, reason))
        if model not in endpoint.models:
            reason = endpoint.error or f"the endpoint {endpoint_name} does not list it"
            return NamedModel(name, UnavailableModel(name, f"{reason}; choose another model"))
        built = endpoint.built.get((model, parameters))
        if built is None:
            built = OpenAIChatModel(
                model,
                base_url=endpoint.config.base_url,
                api_key=endpoint.config.api_key,
                temperature=parameters.temperature,
                max_tokens=parameters.max_tokens,
            )
            endpoint.built[(model, parameters)] = built
        return NamedModel(name, built)

    # --- the endpoints ---------------------------------------------------------------

    async def refresh(self) -> None:
        """Ask every endpoint whose models the config does not list for them, at once.
        While one refresh runs, another waits for it rather than asking again: many
        presses of Refresh cost the endpoints one question each."""
        running = self._refreshing
        if running is None or running.done():
            asked = [e for e in self._endpoints.values() if e.config.models is None]
            running = asyncio.ensure_future(asyncio.gather(*(self._ask(e) for e in asked)))
            self._refreshing = running
        await asyncio.shield(running)

    async def _ask(self, endpoint: _Endpoint) -> None:
        try:
            models = await list_models(endpoint.config, self.timeout)
            error = None if models else f"{_models_url(endpoint.config)} lists no models"
        except ModelError as exc:
            models, error = (), str(exc)
        endpoint.models, endpoint.error, endpoint.checked_at = models, error, time.time()
        if error is not None:
            logger.warning("endpoint %s: its models are missing: %s", endpoint.config.name, error)
        else:
            logger.info("endpoint %s offers %d models", endpoint.config.name, len(models))

    def statuses(self) -> list[EndpointStatus]:
        return [
            EndpointStatus(
                e.config.name,
                _public(e.config.base_url),
                e.models,
                e.config.models is not None,
                e.error,
                e.checked_at,
            )
            for e in self._endpoints.values()
        ]

    def secrets(self) -> list[str]:
        """The endpoints' API keys: never shown in an error."""
        return [e.config.api_key for e in self._endpoints.values() if e.config.api_key]

    def description(self) -> str:
        """One line for the start-up message and the new-chat page, without keys: the
        endpoints that offer models (or have not been asked yet)."""
        if not self._endpoints:
            return ", ".join(describe_model(m.model) for m in self._fixed.values())
        if len(self._endpoints) == 1 and not self._fixed:
            endpoint = next(iter(self._endpoints.values()))
            if endpoint.config.models is not None and len(endpoint.models) == 1:
                return f"{endpoint.models[0]} at {_public(endpoint.config.base_url)}"
        unasked = [
            e for e in self._endpoints.values() if e.config.models is None and not e.checked_at
        ]
        offering = [n for n, e in self._endpoints.items() if e.models or e in unasked]
        if not offering:
            return "no endpoint offers a model now"
        if unasked:  # before the start's questions: how many is not known yet
            return "models of " + ", ".join(offering)
        count = len(self.names())
        return f"{count} model{'s' if count != 1 else ''} of {', '.join(offering)}"

    async def aclose(self) -> None:
        """Release every built model's pooled connections."""
        for endpoint in self._endpoints.values():
            for built in endpoint.built.values():
                await built.aclose()
        for fixed in self._fixed.values():
            close = getattr(fixed.model, "aclose", None)
            if close is not None:
                await close()
