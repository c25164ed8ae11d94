"""A graceful shutdown ends live event streams at once however the app is served.

`python -m webapp` is tested in test_web_cli.py; here the app is embedded the
way its docs offer (`create_app` in a module of one's own) and served by the
``uvicorn`` command, whose graceful shutdown has no timeout by default: a
stream left open would hold the process until the reply ended.
"""

from __future__ import annotations

import html
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from webhelpers import HX, cli_env, free_port, wait_serving

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
    try:
        wait_serving(base, proc)
        with httpx.Client(base_url=base, timeout=10) as http:
            chat = http.post("/chats").headers["location"]
            sent = http.post(chat + "/messages", data={"text": "hi"}, headers=HX)
            found = re.search(r'sse-connect="([^"]+)"', sent.text)
            assert found is not None, (sent.status_code, sent.text[:300])
            with http.stream("GET", html.unescape(found.group(1))) as stream:
                assert stream.status_code == 200
                chunks = stream.iter_bytes()
                next(chunks)  # the stream is live
                signalled = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                for _ in chunks:  # the server ends the stream...
                    pass
            ended = time.monotonic() - signalled
        proc.wait(timeout=15)
        exited = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    # ...at once, though this uvicorn would wait for it as long as the reply lasts
    assert ended < 3 and exited < 4, (ended, exited)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert "Traceback" not in stderr, stderr
    # a clean end of the body, not a cut connection: the browser just reconnects
    assert "without completing response" not in stderr, stderr
