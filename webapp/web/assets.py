"""Where the app's templates and static files are: `TEMPLATES_DIR` and `STATIC_DIR`.

The folders live at the top of the repository, beside ``webapp/``. A built
wheel (``pip install .``, ``pipx install .``) carries them as package data in
``webapp/_assets/`` (pyproject.toml maps them there), so an installed app
serves them from any working directory. An editable install or a run from
the checkout has no ``_assets`` folder and uses the checkout's folders.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
INSTALLED_DIR = PACKAGE_DIR / "_assets"
CHECKOUT_DIR = PACKAGE_DIR.parent


def _assets_dir(name: str) -> Path:
    """The installed copy of folder ``name`` when present, else the checkout's."""
    installed = INSTALLED_DIR / name
    return installed if installed.is_dir() else CHECKOUT_DIR / name


TEMPLATES_DIR: Path = _assets_dir("templates")
STATIC_DIR: Path = _assets_dir("static")
