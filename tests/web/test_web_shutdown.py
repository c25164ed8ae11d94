"""A graceful shutdown ends live event streams at once however the app is served.

`python -m webapp` is tested in test_web_cli.py; here the app is embedded the
way its docs offer (`create_app` in a module of one's own) and served by the
``uvicorn`` command, whose graceful shutdown has no timeout by default: a
stream left open would hold the process until the reply ended.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from webhelpers import cli_env, free_port, sigterm_during_a_reply

SERVED = """\
import os

from webapp.web import create_app

app = create_app(os.environ["CHAT_DB"], offline_delay=0.5)
"""


def test_uvicorn_serving_create_app_ends_live_streams_at_sigterm(tmp_path: Path):
    (tmp_path / "served.py").write_text(SERVED)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "served:app", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(CHAT_DB=str(tmp_path / "c.db")),
        cwd=tmp_path,
    )
    base = f"http://127.0.0.1:{port}"
    ended, exited, stderr = sigterm_during_a_reply(proc, base)
    # ...at once, though this uvicorn would wait for it as long as the reply lasts
    assert ended < 3 and exited < 4, (ended, exited)
    assert "Traceback" not in stderr, stderr
    # a clean end of the body, not a cut connection: the browser just reconnects
    assert "without completing response" not in stderr, stderr
