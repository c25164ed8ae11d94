"""The ``import`` and ``users`` commands of `python -m webapp` (the server is `__main__`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def import_file(argv: Sequence[str]) -> int:
    """`python -m webapp import FILE --db PATH`: a chat exported as JSON into a database."""
    import asyncio
    from pathlib import Path

    from webapp.chats.file_format import MAX_FILE_BYTES, ChatFileError, parse
    from webapp.chats.intake import AttachmentLimits, AttachmentRefused, Intake, Upload
    from webapp.chats.store import EVERY_CHAT, ChatStore
    from webapp.stores.postgres import redact_dsn

    parser = argparse.ArgumentParser(
        prog="webapp import", description="Import a chat exported as JSON into a chat database."
    )
    parser.add_argument("file", help="the exported chat (.json)")
    _db_argument(parser)
    parser.add_argument(
        "--user", metavar="NAME", help="whose chat it becomes (needed once the database has users)"
    )
    args = parser.parse_args(argv)
    path = Path(args.file)
    try:
        limits = AttachmentLimits()  # an import's files meet an upload's limits
        largest = MAX_FILE_BYTES + limits.max_files * limits.max_bytes * 4 // 3
        if path.stat().st_size > largest:
            raise ChatFileError(f"The file is larger than {largest:,} bytes.")
        chat = parse(path.read_bytes())
    except OSError as exc:
        print(f"webapp import: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except ChatFileError as exc:
        print(f"webapp import: {args.file}: {exc} Nothing was imported.", file=sys.stderr)
        return 2

    async def store() -> str | None:
        async with ChatStore(args.db) as chats:
            owner = EVERY_CHAT
            if args.user is not None:
                account = await chats.users.find(args.user.strip().lower())
                if account is None:
                    return None
                owner = account.owner
            elif await chats.users.everyone():
                return None
            intake = Intake(chats.files, limits)
            files = [f for x in chat.files for f in await intake.read([Upload(x.name, x.data)])]
            return await chats.import_chat(owner, chat, files)

    try:
        chat_id = asyncio.run(store())
    except AttachmentRefused as exc:
        print(f"webapp import: {args.file}: {exc} Nothing was imported.", file=sys.stderr)
        return 2
    if chat_id is None:
        why = f"there is no user {args.user!r}" if args.user else "the database has users"
        print(
            f"webapp import: {why}; say whose chat it is with --user NAME (an existing "
            "user). Nothing was imported.",
            file=sys.stderr,
        )
        return 2
    print(f"webapp import: {chat.title or 'New chat'!r} is chat {chat_id} in {redact_dsn(args.db)}")
    return 0


def _db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        default=os.environ.get("WEBAPP_DB") or "chat.db",
        help="chat database: a SQLite file, or postgresql://user:password@host:port/dbname "
        "shared by any number of app processes (env WEBAPP_DB; default ./chat.db)",
    )


def _new_password(args: argparse.Namespace) -> str:
    """From stdin (one line) with ``--password-stdin``, else asked twice at the terminal."""
    import getpass

    if args.password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass(f"Password for {args.name}: ")
    if getpass.getpass("The same again: ") != first:
        raise ValueError("the two passwords differ; nothing was changed")
    return first


def users_command(argv: Sequence[str]) -> int:
    """`python -m webapp users add|list|remove|set-password|api-key`: the accounts of
    --auth password, and people's API keys."""
    import asyncio

    parser = argparse.ArgumentParser(
        prog="webapp users", description="Accounts for --auth password (and header)."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = commands.add_parser("add", help="add an account (the first admin gets older chats)")
    add.add_argument("--admin", action="store_true", help="may manage users at /admin/users")
    setter = commands.add_parser("set-password", help="set an account's password")
    for sub in (add, setter):
        sub.add_argument("name", help="user name")
        sub.add_argument(
            "--password-stdin", action="store_true", help="read the password from stdin"
        )
    remove = commands.add_parser("remove", help="delete an account and all its chats")
    remove.add_argument("name", help="user name")
    shown = commands.add_parser("list", help="list the accounts")
    key = commands.add_parser("api-key", help="make an API key for a user (printed once)")
    key.add_argument("name", help="user name (any name when the database has no accounts)")
    key.add_argument("label", help="the key's name, as the API keys page lists it")
    for sub in (add, setter, remove, shown, key):
        _db_argument(sub)
    args = parser.parse_args(argv)
    try:
        message = asyncio.run(_users(args))
    except ValueError as exc:  # a bad name or password, a name taken: nothing changed
        print(f"webapp users: {exc}", file=sys.stderr)
        return 2
    print(message)
    return 0


async def _users(args: argparse.Namespace) -> str:
    from webapp.chats.passwords import hash_password_async
    from webapp.chats.store import ChatStore
    from webapp.chats.users import EVERY_CHAT, user_name

    async with ChatStore(args.db) as store:
        users = store.users
        if args.command == "list":
            lines = [
                f"{a.name}{' (admin)' if a.is_admin else ''}{' (disabled)' if a.disabled else ''}"
                for a in await users.everyone()
            ]
            return "\n".join(lines) or "webapp users: no accounts yet"
        name = user_name(args.name)
        found = await users.find(name)
        if args.command == "api-key":
            if found is None and await users.everyone():
                raise ValueError(f"there is no user named {name!r}")
            owner = found.owner if found is not None else EVERY_CHAT
            _, made = await store.api_keys.create(owner, args.label)
            return made
        if args.command == "add":
            if found is not None:
                raise ValueError(f"there is already a user named {name!r}")
            account = await users.add(
                name, await hash_password_async(_new_password(args)), admin=args.admin
            )
            return f"webapp users: added {account.name}{' (admin)' if args.admin else ''}"
        if found is None:
            raise ValueError(f"there is no user named {name!r}")
        if args.command == "set-password":
            await users.set_password(found.id, await hash_password_async(_new_password(args)))
            return f"webapp users: new password for {name}"
        chats = await store.remove_user(found.id)
        return f"webapp users: removed {name} and {chats} chat{'s' if chats != 1 else ''}"
