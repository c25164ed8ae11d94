"""The app works from a built wheel, not only from the checkout.

The wheel is built from a copy of the repository, installed into a fresh
virtual environment, and served from an unrelated folder; one message goes
through it. Without the templates and static files inside the wheel the
server cannot start.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import uuid
import venv
import zipfile
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow  # builds and installs the wheel

ROOT = Path(__file__).resolve().parents[1]
# Left out of the copy the wheel is built from: history, environments, caches,
# build output and databases.
SKIPPED_AT_TOP = {".git", ".venv", "venv", "build", "dist", "artifacts", "node_modules"}
SKIPPED_ANYWHERE = shutil.ignore_patterns(
    "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "*.egg-info",
    "*.db", "*.db-wal", "*.db-shm",
)  # fmt: skip
BIN = "Scripts" if os.name == "nt" else "bin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def not_copied(folder: str, names: list[str]) -> set[str]:
    skipped = set(SKIPPED_ANYWHERE(folder, names))
    if Path(folder) == ROOT:
        skipped |= SKIPPED_AT_TOP.intersection(names)
    return skipped


def clean_env() -> dict[str, str]:
    """The environment without anything that would put the checkout or settings in play."""
    env = dict(os.environ)
    for name in list(env):
        if name.startswith(("PYTHON", "PIP_", "WEBAPP_", "OPENAI_")):
            del env[name]
    env["PYTHONNOUSERSITE"] = "1"
    return env


def build_wheel(tmp: Path) -> Path:
    # pip builds in the source folder it is given: building in the checkout would
    # write build/ and webapp.egg-info into a tree others may be using, and
    # setuptools would package any stale file left in build/lib. So build a copy.
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=not_copied)
    dist = tmp / "dist"
    # No build isolation (it would fetch setuptools from an index): the test
    # extra installs a setuptools that builds wheels.
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--isolated", "--no-deps", "--no-index",
         "--no-build-isolation", "--wheel-dir", str(dist), str(source)],
        capture_output=True, text=True, timeout=180, env=clean_env(), cwd=tmp, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = dist.glob("webapp-*.whl")
    check_wheel_contents(wheel, source)
    return wheel


def check_wheel_contents(wheel: Path, source: Path) -> None:
    """Every module of webapp/ and every file of templates/ and static/ is in the wheel."""
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        path.relative_to(source).as_posix()
        for path in (source / "webapp").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    for folder in ("templates", "static"):
        expected |= {
            f"webapp/_assets/{path.relative_to(source).as_posix()}"
            for path in (source / folder).rglob("*")
            if path.is_file() and not path.name.startswith(".")
        }
    assert "webapp/_assets/templates/base.html" in expected
    missing = sorted(expected - names)
    assert not missing, f"missing from {wheel.name} (see pyproject.toml): {missing}"


def dependency_dirs() -> list[str]:
    """The folders this environment has the app's dependencies (and so theirs) in."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    folders: list[str] = []
    for requirement in project["dependencies"]:
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert name is not None, requirement
        folder = str(importlib.metadata.distribution(name[0]).locate_file(""))
        if folder not in folders:
            folders.append(folder)
    return folders


def install_in_fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A new virtual environment with the wheel installed; returns its python."""
    home = tmp / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(home)
    python = home / BIN / ("python.exe" if os.name == "nt" else "python")
    env = clean_env()
    # The venv has no pip of its own: this pip installs into it (--python) and,
    # run before the .pth below exists, sees nothing installed there yet.
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--isolated",
         "--no-deps", "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    site_packages = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp, check=True,
    ).stdout.strip()  # fmt: skip
    # The dependencies come from this environment, without a network: a .pth
    # line naming a folder appends that folder to sys.path, after the venv's own
    # site-packages, so the venv's webapp wins. Unlike a site folder, a folder
    # named this way does not have its own .pth files run, so the editable
    # install's finder (a .pth hook in this environment) never loads.
    Path(site_packages, "_outer_dependencies.pth").write_text(
        "".join(f"{folder}\n" for folder in dependency_dirs()), encoding="utf-8"
    )
    return python


def test_the_installed_wheel_serves_the_app(tmp_path: Path):
    wheel = build_wheel(tmp_path)
    python = install_in_fresh_venv(tmp_path, wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = clean_env()

    imported = subprocess.run(
        [str(python), "-c", "import webapp; print(webapp.__file__)"],
        capture_output=True, text=True, timeout=60, env=env, cwd=elsewhere, check=True,
    ).stdout.strip()  # fmt: skip
    installed = Path(imported).resolve().parent
    assert installed.is_relative_to((tmp_path / "venv").resolve()), imported
    # Mark the installed stylesheets, to tell them from the checkout's when served.
    marker = f"/* installed copy {uuid.uuid4().hex} */"
    stylesheets = sorted((installed / "_assets" / "static").glob("*.css"))
    assert stylesheets
    for stylesheet in stylesheets:
        stylesheet.write_text(stylesheet.read_text(encoding="utf-8") + marker, encoding="utf-8")

    port = free_port()
    log = tmp_path / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [str(python), "-m", "webapp", "--port", str(port), "--db",
             str(tmp_path / "chat.db"), "--offline-delay", "0"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=elsewhere,
        )  # fmt: skip
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", timeout=5, trust_env=False
        ) as client:
            home = wait_for_home(client, server, log)
            assert re.search(r'<textarea[^>]*\bname="text"', home.text), home.text
            links = re.findall(r'<link rel="stylesheet" href="([^"]+)"', home.text)
            assert links, home.text
            for link in links:
                css = client.get(link)
                assert css.status_code == 200, link
                assert css.headers["content-type"].startswith("text/css"), link
                assert marker in css.text, f"{link} is not the installed copy"

            sent = client.post("/chats", data={"text": "count to 3", "client_id": uuid.uuid4().hex})
            assert sent.status_code == 303, sent.text
            chat_url = sent.headers["location"]
            assert re.search(r"/chats/[^/]+$", chat_url), chat_url
            deadline = time.monotonic() + 15
            while "1 2 3" not in (page := client.get(chat_url)).text:
                assert page.status_code == 200, page.text
                assert time.monotonic() < deadline, page.text
                time.sleep(0.1)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)
    assert "Traceback" not in log.read_text(), log.read_text()


def wait_for_home(
    client: httpx.Client, server: subprocess.Popen[bytes], log: Path
) -> httpx.Response:
    deadline = time.monotonic() + 20
    while True:
        assert server.poll() is None, f"the server exited:\n{log.read_text()}"
        try:
            response = client.get("/")
        except httpx.TransportError:
            assert time.monotonic() < deadline, f"no answer in 20 s:\n{log.read_text()}"
            time.sleep(0.1)
            continue
        assert response.status_code == 200, response.text
        return response
