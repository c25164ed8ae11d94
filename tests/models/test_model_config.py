"""Model selection from the CLI's settings."""

from __future__ import annotations

import logging

import pytest

from webapp.models import OfflineModel, OpenAIChatModel, ScriptedModel
from webapp.models.config import describe_model, model_from_settings


def test_no_endpoint_means_the_offline_model() -> None:
    model = model_from_settings(base_url=None, model=None, api_key=None, offline_delay=0.5)
    assert isinstance(model, OfflineModel) and model.delay == 0.5
    assert describe_model(model) == "offline model"
    blank = model_from_settings(base_url="  ", model=None, api_key=None)
    assert isinstance(blank, OfflineModel) and blank.delay == 0.02


def test_a_model_name_without_endpoint_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="webapp.models.config"):
        model = model_from_settings(base_url="", model="llama3.2", api_key="k")
    assert isinstance(model, OfflineModel)
    assert "llama3.2" in caplog.text and "OPENAI_BASE_URL" in caplog.text


def test_an_endpoint_and_a_model_make_an_openai_chat_model() -> None:
    model = model_from_settings(
        base_url="https://api.openai.com/v1/", model=" gpt-4o-mini ", api_key="sk-very-secret"
    )
    assert isinstance(model, OpenAIChatModel)
    assert model.model == "gpt-4o-mini"
    assert model.endpoint == "https://api.openai.com/v1/chat/completions"
    assert describe_model(model) == "gpt-4o-mini at https://api.openai.com/v1"
    assert "sk-very-secret" not in describe_model(model) + repr(model)


def test_an_endpoint_without_a_model_name_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match="--model") as caught:
        model_from_settings(base_url="http://localhost:11434/v1", model=None, api_key=None)
    assert "WEBAPP_MODEL" in str(caught.value)


def test_a_malformed_endpoint_names_the_setting() -> None:
    with pytest.raises(ValueError, match="--base-url"):
        model_from_settings(base_url="localhost:11434", model="llama3.2", api_key=None)


def test_a_bad_offline_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="delay"):
        model_from_settings(base_url=None, model=None, api_key=None, offline_delay=-1)


def test_describe_credentials_in_the_url_are_hidden() -> None:
    model = model_from_settings(
        base_url="http://user:pw@gpu-box:8000/v1", model="qwen", api_key=None
    )
    assert describe_model(model) == "qwen at http://gpu-box:8000/v1"
    assert describe_model(ScriptedModel([])) == "scripted model"
