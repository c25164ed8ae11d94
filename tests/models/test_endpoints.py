"""The model registry (SPEC §12): endpoints, their models, asked over real HTTP on loopback."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import pytest
from chat_server import API_KEY, ChatServer, Reply, chunk, sse, text_reply

from webapp.config import EndpointConfig, PresetConfig
from webapp.errors import ModelError
from webapp.models import OfflineModel, OpenAIChatModel, ScriptedModel
from webapp.models.endpoints import (
    OFFLINE_NAME,
    ModelRegistry,
    NamedModel,
    Parameters,
    UnavailableModel,
    model_name,
)
from webapp.runtime.model import ModelRequest, TextPart, UsagePart
from webapp.transcript import UserEntry
from webapp.usage import Usage


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (the kernel's backlog)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


def closed_port() -> int:
    """A port nothing listens on: connecting is refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_with_no_endpoint_the_offline_model_is_the_one_model() -> None:
    models = ModelRegistry.from_settings(base_url=None, model=None, api_key=None)
    assert models.names() == [OFFLINE_NAME] and models.default == OFFLINE_NAME
    chosen = models.model(None)
    assert isinstance(chosen, NamedModel) and isinstance(chosen.model, OfflineModel)
    assert model_name(chosen) == OFFLINE_NAME and models.description() == "offline model"
    assert models.statuses() == []


def test_the_base_url_shortcut_is_the_endpoint_named_default() -> None:
    models = ModelRegistry.from_settings(
        [EndpointConfig("local", "http://127.0.0.1:9/v1", models=("qwen",))],
        base_url="http://127.0.0.1:8/v1",
        model="gpt-test",
        api_key="sk-abc-123456",
    )
    assert models.names() == ["default/gpt-test", "local/qwen"]
    assert models.default == "default/gpt-test"
    assert models.secrets() == ["sk-abc-123456"]
    with pytest.raises(ValueError, match="--model"):
        ModelRegistry.from_settings(base_url="http://127.0.0.1:8/v1", model=None, api_key=None)
    with pytest.raises(ValueError, match="named 'default'"):
        ModelRegistry.from_settings(
            [EndpointConfig("default", "http://x/v1", models=("m",))],
            base_url="http://127.0.0.1:8/v1",
            model="m",
            api_key=None,
        )


def test_a_preset_must_name_a_configured_endpoint() -> None:
    preset = PresetConfig("Reviewer", "nowhere/model")
    with pytest.raises(ValueError, match="'nowhere'"):
        ModelRegistry([EndpointConfig("local", "http://x/v1", models=("m",))], presets=[preset])


async def test_a_model_is_built_once_per_name_and_parameters() -> None:
    models = ModelRegistry([EndpointConfig("local", "http://127.0.0.1:9/v1", models=("a", "b"))])
    first, again = models.model("local/a"), models.model("local/a")
    assert first.model is again.model  # one pooled client for every chat using it
    assert isinstance(first.model, OpenAIChatModel) and first.model.temperature is None
    warm = models.model("local/a", Parameters(temperature=0.2, max_tokens=64))
    assert (
        warm.model is not first.model
        and warm.model is models.model("local/a", Parameters(0.2, 64)).model
    )
    assert isinstance(warm.model, OpenAIChatModel)
    assert (warm.model.temperature, warm.model.max_tokens) == (0.2, 64)
    assert models.model("local/b").name == "local/b"
    await models.aclose()


async def test_a_model_not_on_offer_fails_its_run_saying_why() -> None:
    models = ModelRegistry([EndpointConfig("local", "http://127.0.0.1:9/v1", models=("a",))])
    for name, says in [
        ("local/gone", "does not list it"),
        ("elsewhere/a", "no endpoint named 'elsewhere'"),
    ]:
        chosen = models.model(name)
        assert chosen.name == name and isinstance(chosen.model, UnavailableModel)
        with pytest.raises(ModelError, match=says):
            async for _ in chosen.stream(ModelRequest("", [UserEntry("hi")])):
                pass
    empty = ModelRegistry()
    assert empty.default is None
    with pytest.raises(ModelError, match="no endpoint offers a model"):
        async for _ in empty.model(None).stream(ModelRequest("", [UserEntry("hi")])):
            pass


async def test_an_endpoint_without_a_list_is_asked_for_its_models(chat_server: ChatServer) -> None:
    chat_server.models = ["served-1", "served-2"]
    models = ModelRegistry(
        [
            EndpointConfig("listed", chat_server.base_url, models=("fixed",)),
            EndpointConfig("asked", chat_server.base_url, api_key=API_KEY),
        ]
    )
    assert models.names() == ["listed/fixed"]  # not asked yet
    assert models.description() == "models of listed, asked"
    before = time.time()
    await models.refresh()
    assert models.names() == ["listed/fixed", "asked/served-1", "asked/served-2"]
    assert models.description() == "3 models of listed, asked"
    assert chat_server.models_asked == 1  # the listed endpoint is never asked
    listed, asked = models.statuses()
    assert listed.listed and listed.checked_at is None
    assert not asked.listed and asked.error is None and asked.models == ("served-1", "served-2")
    assert asked.checked_at is not None and asked.checked_at >= before
    # Refresh asks again: a model the server dropped leaves the picker.
    chat_server.models = ["served-2"]
    await models.refresh()
    assert models.names() == ["listed/fixed", "asked/served-2"]


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (200, '{"object": "list", "data": []}', "lists no models"),
        (200, "<html>not here</html>", "did not answer JSON"),
        (200, '{"models": ["x"]}', "without a 'data' list"),
        (500, '{"error": "down"}', "answered HTTP 500"),
    ],
)
async def test_an_endpoint_that_lists_nothing_costs_only_its_own_models(
    chat_server: ChatServer,
    caplog: pytest.LogCaptureFixture,
    status: int,
    body: str,
    says: str,
) -> None:
    chat_server.models_status, chat_server.models_body = status, body
    models = ModelRegistry(
        [
            EndpointConfig("good", "http://127.0.0.1:9/v1", models=("m",)),
            EndpointConfig("bad", chat_server.base_url),
        ]
    )
    with caplog.at_level(logging.WARNING, logger="webapp.models.endpoints"):
        await models.refresh()
    assert models.names() == ["good/m"] and models.description() == "1 model of good"
    error = models.statuses()[1].error
    assert error is not None and says in error and chat_server.base_url + "/models" in error
    assert "bad" in caplog.text and says in caplog.text


async def test_an_endpoint_that_is_down_or_silent_is_given_up_on_in_bounded_time(
    silent_port: int,
) -> None:
    models = ModelRegistry(
        [
            EndpointConfig("down", f"http://127.0.0.1:{closed_port()}/v1"),
            EndpointConfig("silent", f"http://127.0.0.1:{silent_port}/v1"),
        ],
        timeout=0.5,
    )
    started = time.monotonic()
    await models.refresh()
    assert time.monotonic() - started < 3  # asked at once, each bounded by its timeout
    assert models.names() == [] and models.description() == "no endpoint offers a model now"
    down, silent = models.statuses()
    assert down.error is not None and "cannot reach" in down.error
    assert silent.error is not None and "cannot reach" in silent.error
    with pytest.raises(ModelError, match="cannot reach"):
        async for _ in models.model("down/anything").stream(ModelRequest("", [UserEntry("x")])):
            pass


async def test_parameters_reach_the_endpoint_and_usage_and_model_come_back(
    chat_server: ChatServer,
) -> None:
    """A real OpenAI-compatible server on loopback: the request carries the model's name,
    the preset's parameters and asks for usage; the usage it reports comes back."""
    models = ModelRegistry([EndpointConfig("local", chat_server.base_url, models=("m-7b",))])
    chat_server.script.append(text_reply("Hello", " there", usage=(42, 7)))
    chosen = models.model("local/m-7b", Parameters(temperature=0.3, max_tokens=99))
    parts = [p async for p in chosen.stream(ModelRequest("Be brief.", [UserEntry("hi")]))]
    body = chat_server.received[0].body
    assert body["model"] == "m-7b" and body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["max_tokens"]) == (0.3, 99)
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert "".join(p.text for p in parts if isinstance(p, TextPart)) == "Hello there"
    assert [p.usage for p in parts if isinstance(p, UsagePart)] == [Usage(42, 7)]
    await models.aclose()


async def test_an_endpoint_that_reports_no_usage_yields_none(chat_server: ChatServer) -> None:
    models = ModelRegistry([EndpointConfig("local", chat_server.base_url, models=("m",))])
    chat_server.script.append(
        Reply(body=[chunk({"content": "x"}), chunk({}, "stop"), sse("[DONE]")])
    )
    parts = [p async for p in models.model("local/m").stream(ModelRequest("", [UserEntry("q")]))]
    assert not [p for p in parts if isinstance(p, UsagePart)]
    await models.aclose()


def test_a_model_given_whole_is_named_after_its_kind() -> None:
    assert ModelRegistry.single(OfflineModel()).names() == [OFFLINE_NAME]
    assert ModelRegistry.single(ScriptedModel(["x"])).names() == ["default/scriptedmodel"]
    given = OpenAIChatModel("gpt-x", base_url="http://127.0.0.1:9/v1")
    single = ModelRegistry.single(given)
    assert single.names() == ["default/gpt-x"] and single.model(None).model is given
