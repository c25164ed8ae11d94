"""The README is the user's manual: it must stay true to the code and to CI."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from webapp.config import parse_config
from webapp.models.endpoints import ModelRegistry

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    following = README.find("\n## ", start + 1)
    return README[start : following if following != -1 else len(README)]


def test_quick_start_gives_exactly_two_commands():
    blocks = re.findall(r"```sh\n(.*?)```", section("Quick start").split("### ")[0], re.DOTALL)
    assert len(blocks) == 2
    assert all(len(b.strip().splitlines()) == 1 for b in blocks)
    assert "python -m webapp" in blocks[0] and "pytest" in blocks[1]


def test_ci_runs_the_readme_test_command():
    # the same extraction .ci/run performs
    marked = README.split("<!-- test-command -->")[1].split("<!-- /test-command -->")[0]
    command = [line for line in marked.splitlines() if line and not line.startswith("```")]
    assert len(command) == 1 and "pytest" in command[0]
    assert "<!-- test-command -->" in (ROOT / ".ci" / "run").read_text()


def test_every_cli_flag_and_environment_variable_is_documented():
    out = subprocess.run(
        [sys.executable, "-m", "webapp", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=True,
    ).stdout
    flags = set(re.findall(r"(--[a-z][a-z-]+)", out)) - {"--help"}
    assert {
        "--host",
        "--port",
        "--db",
        "--model",
        "--base-url",
        "--api-key",
        "--offline-delay",
    } <= flags
    table = section("Quick start")
    missing = sorted(f for f in flags if f"`{f}`" not in table)
    assert not missing, f"flags missing from README's command-line table: {missing}"

    source = (ROOT / "webapp" / "__main__.py").read_text()
    variables = set(re.findall(r'env\("([A-Z_]+)"\)', source))
    assert {"OPENAI_BASE_URL", "OPENAI_API_KEY", "WEBAPP_MODEL", "WEBAPP_DB"} <= variables
    assert not sorted(v for v in variables if f"`{v}`" not in table)


def test_configuration_examples_cover_the_usual_servers():
    config = section("Configuration")
    for needle in ("api.openai.com/v1", "localhost:11434/v1", "vllm serve", "llama-server"):
        assert needle in config


def test_the_runtime_example_runs_as_written(tmp_path):
    code = re.search(r"```python\n(.*?)```", section("The runtime, from Python"), re.DOTALL)
    script = tmp_path / "example.py"
    script.write_text(code.group(1))
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=True,
    )
    assert out.stdout.strip() == "12*(3+4) = 84"
    assert (tmp_path / "chat.db").exists()


def test_the_endpoints_and_presets_example_is_a_valid_config():
    (block,) = [
        b
        for b in re.findall(r"```toml\n(.*?)```", section("Configuration"), re.DOTALL)
        if "[[endpoints]]" in b
    ]
    config = parse_config(
        tomllib.loads(block), where="README", environ={"OPENAI_API_KEY": "sk-example"}
    )
    assert [e.name for e in config.endpoints] == ["openai", "ollama", "vllm", "llamacpp"]
    assert len(config.presets) == 2
    models = ModelRegistry(config.endpoints, presets=config.presets)  # presets name endpoints
    assert models.names()[:3] == [
        "openai/gpt-4o-mini",
        "openai/gpt-4o",
        "llamacpp/qwen2.5-7b-instruct",
    ]
