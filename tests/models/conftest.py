"""Fixtures for the model tests: one scripted chat server per test session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from chat_server import API_KEY, ChatServer

from webapp.models import OpenAIChatModel


@pytest.fixture(scope="session")
def _chat_server_process() -> Iterator[ChatServer]:
    server = ChatServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def chat_server(_chat_server_process: ChatServer) -> Iterator[ChatServer]:
    _chat_server_process.reset()
    yield _chat_server_process
    _chat_server_process.reset()


@pytest.fixture
async def chat_model(chat_server: ChatServer) -> AsyncIterator[OpenAIChatModel]:
    model = OpenAIChatModel(
        "test-model",
        base_url=chat_server.base_url,
        api_key=API_KEY,
        timeout=5,
        connect_timeout=2,
        retry_backoff=0.01,
        max_retry_wait=0.2,
    )
    yield model
    await model.aclose()
