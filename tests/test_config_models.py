"""The config file's [[endpoints]] and [[presets]] (SPEC §12): what is read, what is refused."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from webapp.config import (
    AppConfig,
    ConfigError,
    EndpointConfig,
    PresetConfig,
    load_config,
    parse_config,
)

GOOD = """
[[endpoints]]
name = "local"
base_url = "http://127.0.0.1:8080/v1/"
api_key_env = "LOCAL_API_KEY"
models = ["qwen2.5-7b", " llama3.2 "]

[[endpoints]]
name = "ollama_2"
base_url = "http://localhost:11434/v1"

[[presets]]
name = "Code reviewer"
model = "local/qwen2.5-7b"
instructions = "You review code. Be specific."
temperature = 0.2
max_tokens = 512

[[presets]]
name = "  Plain   chat "
model = "ollama_2/anything"
"""


def parsed(text: str, **environ: str) -> AppConfig:
    return parse_config(tomllib.loads(text), where="app.toml", environ=environ)


def test_endpoints_and_presets_are_read_in_order(tmp_path: Path) -> None:
    path = tmp_path / "app.toml"
    path.write_text(GOOD)
    config = load_config(path, environ={"LOCAL_API_KEY": "sk-local-secret"})
    assert config.endpoints == (
        EndpointConfig(
            "local",
            "http://127.0.0.1:8080/v1",
            "LOCAL_API_KEY",
            "sk-local-secret",
            ("qwen2.5-7b", "llama3.2"),
        ),
        EndpointConfig("ollama_2", "http://localhost:11434/v1"),  # no list: asked at start
    )
    assert config.presets == (
        PresetConfig(
            "Code reviewer", "local/qwen2.5-7b", "You review code. Be specific.", 0.2, 512
        ),
        PresetConfig("Plain chat", "ollama_2/anything"),
    )
    assert config.mcp_servers == ()
    # The key is the environment's, and it never shows in a repr (logs, tracebacks).
    assert "sk-local-secret" not in repr(config)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[endpoints]\nname = "x"', "array of tables"),
        ('[[endpoints]]\nbase_url = "http://x/v1"', "name must be a string"),
        ('[[endpoints]]\nname = "a b"\nbase_url = "http://x/v1"', "letters, digits"),
        ('[[endpoints]]\nname = "a"\nbase_url = "x:8080/v1"', "http:// or https://"),
        ('[[endpoints]]\nname = "a"\nbase_url = "http://x"\nkey = "k"', "unknown key 'key'"),
        ('[[endpoints]]\nname = "a"\nbase_url = "http://x"\nmodels = []', "leave it out"),
        ('[[endpoints]]\nname = "a"\nbase_url = "http://x"\nmodels = ["m", "m"]', "twice"),
        (
            '[[endpoints]]\nname = "a"\nbase_url = "http://x"\nmodels = [""]',
            "models[0] ('') is blank",
        ),
        ('[[endpoints]]\nname = "a"\nbase_url = "http://x"\nmodels = [1]', "list of model names"),
        (  # duplicates and blanks, each named (it said only "a list of model names")
            '[[endpoints]]\nname = "a"\nbase_url = "http://x"\nmodels = ["m", "m", " ", ""]',
            (
                "models[2] (' ') is blank; models[3] ('') is blank; a name must be unique, "
                "and 'm' is given twice"
            ),
        ),
        (
            '[[endpoints]]\nname = "a"\nbase_url = "http://x"\nmodels = ["evil\\u202egpt"]',
            "U+202E",
        ),
        (
            '[[endpoints]]\nname = "a"\nbase_url = "http://x"\napi_key_env = "NOT_SET_HERE"',
            "NOT_SET_HERE, which is not set",
        ),
        (
            '[[endpoints]]\nname = "a"\nbase_url = "http://x"\n' * 2,
            "'a' is given twice",
        ),
        ('[[presets]]\nname = "p"\nmodel = "no-slash"', "endpoint/model"),
        ('[[presets]]\nname = ""\nmodel = "a/m"', "1-80 characters"),
        ('[[presets]]\nname = "p"\nmodel = "a/m"\ntemperature = 3', "from 0 to 2"),
        ('[[presets]]\nname = "p"\nmodel = "a/m"\ntemperature = true', "from 0 to 2"),
        ('[[presets]]\nname = "p"\nmodel = "a/m"\nmax_tokens = 0', "at least 1"),
        ('[[presets]]\nname = "p"\nmodel = "a/m"\nmax_tokens = 1.5', "whole number"),
        ('[[presets]]\nname = "p"\nmodel = "a/m"\ntop_p = 1', "unknown key 'top_p'"),
        (
            '[[endpoints]]\nname = "a"\nbase_url = "http://x"\nmodels = ["m"]\n'
            + '[[presets]]\nname = "p"\nmodel = "a/other"',
            "not in endpoint a's models",
        ),
        ('[[presets]]\nname = "p"\nmodel = "a/m"\n[[presets]]\nname = "p"\nmodel = "a/n"', "twice"),
        ('default_model = "a/m"', "unknown table or key 'default_model'"),
    ],
)
def test_a_mistake_is_refused_naming_the_table_and_the_key(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match="app.toml") as caught:
        parsed(text)
    assert says in str(caught.value)


def test_a_model_name_may_hold_a_slash_after_the_endpoint() -> None:
    config = parsed('[[presets]]\nname = "p"\nmodel = "vllm/Qwen/Qwen2.5-7B-Instruct"')
    assert config.presets[0].model == "vllm/Qwen/Qwen2.5-7B-Instruct"
