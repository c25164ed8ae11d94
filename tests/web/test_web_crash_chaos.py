"""Chaos: many chats streaming, the server killed with -9 several times (SPEC §6).

Every reply must end exact (each number once, in order), and every state a
follower's page showed must be a beginning of that finished reply, never more
than 250 ms of text ahead of what came back after a crash.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from following import Follower, most_words_gone_back
from webhelpers import HX, cli_env, free_port, parse_html, replies, wait_serving

CHATS = 12
COUNT = 200
DELAY = 0.02  # the offline model's pause between numbers: 250 ms of text is 12.5 numbers
MAX_NUMBERS_BACK = 25  # 12.5, and a margin for a loaded machine
CRASHES = 3


def start(db: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "webapp", "--port", str(port), "--db", str(db)]
    command += ["--offline-delay", str(DELAY)]
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=cli_env())
    wait_serving(f"http://127.0.0.1:{port}", proc, log)
    return proc


async def test_many_chats_several_kill_9s_every_reply_exact(tmp_path: Path):
    db, port, log = tmp_path / "chat.db", free_port(), tmp_path / "server.log"
    base = f"http://127.0.0.1:{port}"
    expected = " ".join(str(n) for n in range(1, COUNT + 1))
    limits = httpx.Limits(max_connections=4 * CHATS)
    proc = start(db, port, log)
    try:
        async with httpx.AsyncClient(base_url=base, timeout=10, limits=limits) as http:
            followers, chat_ids = [], []
            for _ in range(CHATS):
                chat_id = (await http.post("/chats")).headers["location"].rsplit("/", 1)[1]
                sent = await http.post(
                    f"/chats/{chat_id}/messages", data={"text": f"count to {COUNT}"}, headers=HX
                )
                followers.append(Follower.of_send(http, base, sent.text))
                chat_ids.append(chat_id)
            tasks = [asyncio.create_task(f.follow(timeout=180)) for f in followers]
            for crash in range(CRASHES):
                await asyncio.sleep(0.6 + 0.3 * crash)  # the replies move on between crashes
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                proc = start(db, port, log)
            await asyncio.gather(*tasks)
            pages = [parse_html((await http.get(f"/chats/{c}")).text) for c in chat_ids]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    for follower, page in zip(followers, pages, strict=True):
        assert " ".join(follower.text.split()) == expected
        (reply,) = replies(page)
        assert " ".join(reply.find(class_="content").text().split()) == expected
        for shown in follower.shown:  # every number the page showed is in the final reply
            assert expected.startswith(" ".join(shown.split()))
    worst = max(most_words_gone_back(f.shown) for f in followers)
    resumed = log.read_text().count("resuming run")
    print(f"{resumed} resumptions; the most a page went back: {worst} numbers")
    assert resumed >= CRASHES  # the crashes did land mid-reply
    assert worst <= MAX_NUMBERS_BACK
