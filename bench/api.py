"""The API's cost and latency (issue 32, SPEC §16), end to end.

Run from the repository root: ``python bench/api.py`` (about a minute).

The fake endpoint of ``bench/stream.py`` (its own process) streams chat-completion
chunks, one token each; the app runs as ``python -m webapp --base-url ...`` and is
called the way a program calls it, on ``/v1/chat/completions``. Measured:

- time to first token added over a direct request: the first content chunk through
  the API minus the same wait on a request made straight to the endpoint (medians of
  sequential requests, each of 20 tokens, alternating the two);
- server CPU per 1,000 streamed tokens: utime+stime of the app process from
  ``/proc/<pid>/stat`` around ``--streams`` concurrent streams of 1,000 tokens each,
  every one read to ``[DONE]`` and checked whole (the request's fixed cost included);
- a replayed idempotent request: server CPU per repeat of a request whose answer is
  stored (``Idempotency-Key``, not streamed), over ``--replays`` sequential repeats.

``--litellm BIN`` also starts LiteLLM's proxy (``litellm[proxy]`` installed in a venv of
its own, e.g. ``/tmp/litellm-venv/bin/litellm``) in front of the same endpoint and
measures it the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from stream import (
    ROOT,
    cpu_seconds,
    expected_text,
    free_port,
    stop,
    wait_listening,
)

MODEL = "default/fake"
# LiteLLM's proxy insists on a master key; the app (--auth none) needs none.
MASTER_KEY = "sk-bench-0123456789abcdef0123456789abcdef"
AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}


async def first_token(http: httpx.AsyncClient, url: str, model: str, ask: str) -> float:
    """Seconds from the request to its first content chunk (the rest read to the end)."""
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": ask}]}
    start = time.monotonic()
    elapsed = None
    async with http.stream("POST", url, json=body) as response:
        async for line in response.aiter_lines():
            if elapsed is None and line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    elapsed = time.monotonic() - start
    if elapsed is None:
        raise RuntimeError(f"{url} sent no token")
    return elapsed


async def streamed_text(http: httpx.AsyncClient, url: str, model: str, ask: str) -> str:
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": ask}]}
    parts = []
    async with http.stream("POST", url, json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices") or []:
                    parts.append(choice.get("delta", {}).get("content") or "")
    return "".join(parts)


async def added_ttft(endpoint: str, api: str, model: str, rounds: int) -> tuple[float, float]:
    direct, through = [], []
    async with httpx.AsyncClient(timeout=60, headers=AUTH) as http:
        for i in range(rounds):
            direct.append(await first_token(http, endpoint, "fake", f"id=d{i} tokens=20 rate=0"))
            through.append(await first_token(http, api, model, f"id=a{i} tokens=20 rate=0"))
    return statistics.median(direct), statistics.median(through)


async def cpu_per_1000(api: str, model: str, pid: int, streams: int) -> float:
    async with httpx.AsyncClient(timeout=120, headers=AUTH) as http:
        await streamed_text(http, api, model, "id=warm tokens=50 rate=0")
        before = cpu_seconds(pid)
        texts = await asyncio.gather(
            *(
                streamed_text(http, api, model, f"id=c{i} tokens=1000 rate=0")
                for i in range(streams)
            )
        )
        used = cpu_seconds(pid) - before
    if any(t != expected_text(1000) for t in texts):
        raise RuntimeError("a stream arrived incomplete")
    return used / streams


async def replay_cpu(api: str, model: str, pid: int, replays: int) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "id=r tokens=200 rate=0"}]}
    headers = {"Idempotency-Key": "bench-replay"}
    async with httpx.AsyncClient(timeout=60, headers=AUTH) as http:
        first = (await http.post(api, json=body, headers=headers)).json()
        for _ in range(5):  # warm
            await http.post(api, json=body, headers=headers)
        before = cpu_seconds(pid)
        for _ in range(replays):
            again = (await http.post(api, json=body, headers=headers)).json()
        used = cpu_seconds(pid) - before
    if again["id"] != first["id"] or again["choices"] != first["choices"]:
        raise RuntimeError("a replay differed from the answer")
    return used / replays


def start_litellm(command: str, endpoint_port: int, folder: Path) -> subprocess.Popen[bytes]:
    config = folder / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: fake\n    litellm_params:\n      model: openai/fake\n"
        f"      api_base: http://127.0.0.1:{endpoint_port}/v1\n      api_key: unused\n"
        f"general_settings:\n  master_key: {MASTER_KEY}\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [command, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # it listens before it is ready: ask for its models
        try:
            if (
                httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=AUTH, timeout=2).status_code
                == 200
            ):
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"litellm exited with {proc.returncode}")
        time.sleep(0.5)
    raise RuntimeError("litellm did not answer within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--replays", type=int, default=300)
    parser.add_argument("--litellm", default="", metavar="BIN", help="LiteLLM's proxy command")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        endpoint_port, port = free_port(), free_port()
        endpoint = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("stream.py")),
                "endpoint",
                str(endpoint_port),
            ]
        )
        command = [sys.executable, "-m", "webapp", "--port", str(port), "--db", f"{tmp}/a.db"]
        command += ["--base-url", f"http://127.0.0.1:{endpoint_port}/v1", "--model", "fake"]
        app = subprocess.Popen(
            [*command, "--log-level", "warning"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        peers: list[subprocess.Popen[bytes]] = []
        try:
            wait_listening(endpoint_port, endpoint, "the fake endpoint")
            wait_listening(port, app, "the app")
            direct_url = f"http://127.0.0.1:{endpoint_port}/v1/chat/completions"
            targets = [("webapp", f"http://127.0.0.1:{port}/v1", MODEL, app.pid)]
            if args.litellm:
                peer = start_litellm(args.litellm, endpoint_port, Path(tmp))
                peers.append(peer)
                targets.append(
                    ("litellm", f"http://127.0.0.1:{peer.args[-1]}/v1", "fake", peer.pid)
                )
            for label, base, model, pid in targets:
                url = base + "/chat/completions"
                direct, through = asyncio.run(added_ttft(direct_url, url, model, args.rounds))
                print(
                    f"{label}: first token {through * 1000:.1f} ms, direct {direct * 1000:.1f} ms"
                    f" -> added {(through - direct) * 1000:.1f} ms (median of {args.rounds})"
                )
                if pid:
                    cpu = asyncio.run(cpu_per_1000(url, model, pid, args.streams))
                    print(f"{label}: server CPU per 1,000 streamed tokens {cpu * 1000:.1f} ms")
                if label == "webapp":
                    cpu = asyncio.run(replay_cpu(url, model, pid, args.replays))
                    print(
                        f"{label}: server CPU per replayed idempotent request {cpu * 1000:.2f} ms"
                    )
        finally:
            for proc in (app, *peers, endpoint):
                stop(proc)


if __name__ == "__main__":
    main()
