"""``GET {base_url}/models``: the model ids an endpoint lists, read within bounds.

The endpoint is a remote party, and its answer is untrusted (SPEC §17). Each
bound is named for the failure it prevents:
- a total deadline (`timeout`), not only one per read: a body that trickles a
  byte every few seconds held the app's start-up for ten minutes, since
  httpx's timeout bounds each read, not the whole request;
- at most `MAX_BODY_BYTES` read: a 69 MB list made a process of a gigabyte;
- parsed on a worker thread: parsing megabytes of JSON on the event loop held
  every page and stream for seconds;
- at most `MAX_MODELS` ids, each a name `webapp.config.model_id_problem`
  accepts (at most 200 characters, nothing invisible or controlling): every
  page offers the models, and 10,000 ids or one id of 1 MB made each page
  several megabytes. What is left out is logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from webapp.config import EndpointConfig, model_id_problem
from webapp.errors import ModelError

logger = logging.getLogger("webapp.models.endpoints")

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_MODELS = 1_000
DEADLINE_MARGIN = 1.0  # seconds the whole answer may take beyond one read's timeout


async def list_models(endpoint: EndpointConfig, timeout: float) -> tuple[str, ...]:
    """The model ids ``GET {base_url}/models`` lists, all of it within ``timeout``
    seconds; `ModelError` says why not."""
    url = models_url(endpoint)
    # Each read gets ``timeout`` (a silent server is "cannot reach"), the whole a little more.
    deadline = timeout + DEADLINE_MARGIN
    try:
        async with asyncio.timeout(deadline):
            status, reason, body = await _fetch(endpoint, url, timeout)
    except TimeoutError:
        raise ModelError(f"{url} did not answer in full within {deadline:g} s") from None
    if status != 200:
        raise ModelError(f"{url} answered HTTP {status} {reason}")
    return await asyncio.to_thread(model_ids, body, url)


async def _fetch(endpoint: EndpointConfig, url: str, timeout: float) -> tuple[int, str, bytes]:
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    try:
        async with (
            httpx.AsyncClient(timeout=timeout, trust_env=True) as client,
            client.stream("GET", endpoint.base_url + "/models", headers=headers) as response,
        ):
            if response.status_code != 200:
                return response.status_code, response.reason_phrase, b""
            body = bytearray()
            async for piece in response.aiter_bytes():
                body += piece
                if len(body) > MAX_BODY_BYTES:
                    raise ModelError(
                        f"{url} answered more than {MAX_BODY_BYTES // (1024 * 1024)} MB; "
                        "list the endpoint's models in the config file instead"
                    )
            return 200, response.reason_phrase, bytes(body)
    except httpx.HTTPError as exc:
        detail = str(exc) or type(exc).__name__
        raise ModelError(f"cannot reach {url} ({detail}); is the server running?") from None


def model_ids(body: bytes, url: str) -> tuple[str, ...]:
    """The ids of a ``/models`` answer, each once, the unusable ones left out (logged)."""
    try:
        document: Any = json.loads(body)
    except ValueError:
        raise ModelError(f"{url} did not answer JSON") from None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise ModelError(f"{url} answered without a 'data' list of models")
    kept: dict[str, None] = {}
    refused = 0
    for item in data:
        name = item.get("id") if isinstance(item, dict) else None
        if not isinstance(name, str):
            continue
        # A name with a slash is fine (Qwen/Qwen2.5-7B): only the endpoint's part ends at one.
        name = name.strip()
        if model_id_problem(name) is not None:
            refused += name != ""
            continue
        kept[name] = None
        if len(kept) == MAX_MODELS:
            break
    if refused:
        logger.warning(
            "%s: left out %d model ids that are too long or hold control characters", url, refused
        )
    if len(kept) == MAX_MODELS and len(data) > MAX_MODELS:
        logger.warning(
            "%s lists %d models: only the first %d are offered", url, len(data), MAX_MODELS
        )
    return tuple(kept)


def models_url(endpoint: EndpointConfig) -> str:
    return public_url(endpoint.base_url) + "/models"


def public_url(url: str) -> str:
    """The URL without any user:password@ part."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
