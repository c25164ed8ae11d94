"""Switches a chat between two versions forever, for the kill -9 test to interrupt.

usage: python switch_worker.py DB CHAT_ID RUN_A RUN_B   (prints "ready" once started)
"""

from __future__ import annotations

import asyncio
import sys

from webapp.chats.store import ChatStore
from webapp.chats.users import EVERY_CHAT


async def main(db: str, chat_id: str, first: str, second: str) -> None:
    store = ChatStore(db)
    await store.switch(EVERY_CHAT, chat_id, first)
    print("ready", flush=True)
    while True:
        await store.switch(EVERY_CHAT, chat_id, second)
        await store.switch(EVERY_CHAT, chat_id, first)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
