"""A chat's own model and instructions: what the picker and Chat options change, and
the agent each of the chat's runs gets (SPEC §12).

`apply` is what `webapp.web.agents` composes into the agent that
`webapp.web.live.runs.RunManager` asks for at every start and resume: the app's
agent with the chat's model, instructions and preset parameters. The model comes from the registry, built once per name and
parameters. A resume takes the run's own model (recorded when it started), so
one reply is never written by two models; its system prompt is rendered again
from the chat's instructions as they are then, as the seed's resume does: new
instructions saved while a crash interrupted a run apply to the rest of it.

Nothing here takes the chat's lock: a setting is one row's update, read by the
next run's start (which happens under the lock), so a change made while a reply
streams applies from the next run on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Union

from webapp.chats.settings import MAX_INSTRUCTIONS_CHARS, ChatSettings
from webapp.chats.store import ChatStore
from webapp.config import PresetConfig
from webapp.models.endpoints import ModelRegistry, NamedModel, Parameters
from webapp.runtime.agent import Agent, Instructions
from webapp.web.outcomes import ChatNotFound


def chat_model(models: ModelRegistry, settings: ChatSettings) -> NamedModel:
    """The model a run of the chat uses: its active run's own, else the chat's choice,
    else the app's default."""
    parameters = Parameters(settings.temperature, settings.max_tokens)
    return models.model(settings.run_model or settings.model, parameters)


def chat_instructions(settings: ChatSettings, default: Instructions) -> Instructions:
    """The chat's system prompt: its own instructions, or the app's when it has none."""
    return settings.instructions if settings.instructions.strip() else default


def chat_agent(base: Agent, models: ModelRegistry, settings: ChatSettings | None) -> Agent:
    """``base`` with the chat's model and instructions."""
    settings = settings or ChatSettings()
    return replace(
        base,
        model=chat_model(models, settings),
        instructions=chat_instructions(settings, base.instructions),
    )


@dataclass(frozen=True)
class Saved:
    settings: ChatSettings


@dataclass(frozen=True)
class Refused:
    """The choice is not one the app offers, or the text is too long; says which."""

    message: str


SaveOutcome = Union[Saved, ChatNotFound, Refused]


@dataclass(frozen=True)
class Picker:
    """What the composer's Model select shows."""

    options: list[str]  # every model on offer, endpoint/model
    selected: str | None
    unavailable: bool  # the chat's model is not on offer now (it is still shown, marked)


class ChatModels:
    """A chat's model and instructions: the agent of its runs, and their changes."""

    def __init__(self, *, store: ChatStore, registry: ModelRegistry, agent: Agent) -> None:
        self.store = store
        self.registry = registry  # the models on offer
        self.agent = agent  # the app's own: its instructions are the default

    async def apply(self, base: Agent, chat_id: str) -> Agent:
        """``base`` with the chat's model and instructions (`webapp.web.agents` composes)."""
        return chat_agent(base, self.registry, await self.store.settings.get(chat_id))

    async def settings(self, chat_id: str) -> ChatSettings | None:
        return await self.store.settings.get(chat_id)

    def picker(self, settings: ChatSettings | None) -> Picker:
        options = self.registry.names()
        selected = (settings.model if settings else None) or self.registry.default
        unavailable = selected is not None and selected not in options
        return Picker(
            options + ([selected] if unavailable and selected else []), selected, unavailable
        )

    def status(self) -> dict[str, Any]:
        """What the Tools page's Models section (`_models_status.html`) shows."""
        return {"endpoints": self.registry.statuses(), "model_names": self.registry.names()}

    @property
    def default_instructions(self) -> str:
        instructions = self.agent.instructions
        return instructions if isinstance(instructions, str) else ""

    async def choose(self, chat_id: str, model: str) -> SaveOutcome:
        """The chat's model from its next run on (Send, Edit, Regenerate, Continue)."""
        if model not in self.registry.names():
            return Refused(
                f"The model {model!r} is not on offer: reload the page and choose again."
            )
        if not await self.store.settings.set_model(chat_id, model):
            return ChatNotFound()
        return await self._saved(chat_id)

    async def instruct(self, chat_id: str, instructions: str) -> SaveOutcome:
        """The chat's system prompt from its next run on; "" restores the default."""
        if len(instructions) > MAX_INSTRUCTIONS_CHARS:
            return Refused(
                f"The instructions are {len(instructions):,} characters long; the limit is "
                f"{MAX_INSTRUCTIONS_CHARS:,}."
            )
        if not await self.store.settings.set_instructions(chat_id, instructions):
            return ChatNotFound()
        return await self._saved(chat_id)

    def for_new_chat(self, preset: str | None, model: str | None) -> ChatSettings | Refused | None:
        """What a new chat starts with: a preset's model, instructions and parameters, or
        a model chosen in the picker; None for the defaults."""
        if preset:
            found = self.registry.preset(preset)
            if found is None:
                return Refused(f"There is no preset {preset!r}: reload the page and choose again.")
            return _from_preset(found)
        if model:
            if model not in self.registry.names():
                return Refused(f"The model {model!r} is not on offer: choose another.")
            return ChatSettings(model=model)
        return None

    async def _saved(self, chat_id: str) -> SaveOutcome:
        settings = await self.store.settings.get(chat_id)
        return Saved(settings) if settings is not None else ChatNotFound()


def _from_preset(preset: PresetConfig) -> ChatSettings:
    return ChatSettings(preset.model, preset.instructions, preset.temperature, preset.max_tokens)
