"""Choosing the model from the CLI's settings (flags, with environment fallbacks).

The CLI resolves ``--base-url``/``OPENAI_BASE_URL``, ``--model``/``WEBAPP_MODEL``
and ``--api-key``/``OPENAI_API_KEY`` and passes the values here. No endpoint
means the offline model, so a fresh checkout works with no network and no key.
"""

from __future__ import annotations

import logging

from webapp.models.offline import OfflineModel
from webapp.models.openai_chat import OpenAIChatModel
from webapp.runtime.model import Model

logger = logging.getLogger("webapp.models.config")


def model_from_settings(
    *,
    base_url: str | None,
    model: str | None,
    api_key: str | None,
    offline_delay: float = 0.02,
) -> Model:
    """The model the settings describe; raises ValueError naming the setting to fix."""
    base_url = (base_url or "").strip()
    name = (model or "").strip()
    if not base_url:
        if name:
            # Not an error (the env may set WEBAPP_MODEL for another setup), but
            # a user who meant to reach a real model should see why they don't.
            logger.warning(
                "model %r ignored: no endpoint configured (--base-url / OPENAI_BASE_URL), "
                "using the offline model",
                name,
            )
        return OfflineModel(delay=offline_delay)
    if not name:
        raise ValueError(
            f"an endpoint is configured ({base_url}) but no model name: pass --model NAME "
            "or set WEBAPP_MODEL (e.g. gpt-4o-mini for OpenAI, llama3.2 for Ollama)"
        )
    try:
        return OpenAIChatModel(name, base_url=base_url, api_key=(api_key or "").strip() or None)
    except ValueError as exc:
        raise ValueError(f"{exc} (from --base-url / OPENAI_BASE_URL)") from None


def describe_model(model: object) -> str:
    """One line for logs and the UI, e.g. "gpt-4o-mini at https://api.openai.com/v1".

    Never includes the API key (or credentials embedded in the URL).
    """
    if isinstance(model, OfflineModel):
        return "offline model"
    if isinstance(model, OpenAIChatModel):
        return f"{model.model} at {model.public_endpoint.removesuffix('/chat/completions')}"
    name = type(model).__name__
    return "scripted model" if name == "ScriptedModel" else name
