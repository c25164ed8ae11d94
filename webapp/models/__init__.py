"""Model adapters: anything that implements `webapp.models.Model`."""

from webapp.models.offline import OfflineModel
from webapp.models.openai_chat import OpenAIChatModel
from webapp.models.scripted import ScriptedModel
from webapp.runtime.model import Model

__all__ = ["Model", "OfflineModel", "OpenAIChatModel", "ScriptedModel"]
