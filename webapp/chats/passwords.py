"""Passwords: Argon2id hashes through argon2-cffi, checked off the event loop.

A hash takes tens of milliseconds of CPU by design; it runs in a worker
thread so the server goes on streaming everyone's replies meanwhile. A
sign-in for a name that has no account still checks the password against a
hash of nothing anyone knows, so a wrong name and a wrong password take the
same time as well as getting the same message.
"""

from __future__ import annotations

import asyncio
import functools
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 1024  # Argon2 takes any length; a megabyte of "password" is an attack

_hasher = PasswordHasher()


class PasswordError(ValueError):
    """A password too short or too long to be set."""


def check_new_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_CHARS:
        raise PasswordError(f"A password needs at least {MIN_PASSWORD_CHARS} characters.")
    if len(password) > MAX_PASSWORD_CHARS:
        raise PasswordError(f"A password may have at most {MAX_PASSWORD_CHARS} characters.")
    return password


def hash_password(password: str) -> str:
    """The Argon2id hash of a new password (`PasswordError` if it is too short or long)."""
    return _hasher.hash(check_new_password(password))


async def hash_password_async(password: str) -> str:
    return await asyncio.to_thread(hash_password, password)


@functools.cache
def _nobody() -> str:
    return _hasher.hash(secrets.token_hex(16))


def _verify(stored: str | None, password: str) -> bool:
    try:
        return _hasher.verify(stored or _nobody(), password) and stored is not None
    except (VerificationError, InvalidHashError):
        return False


async def verify_password(stored: str | None, password: str) -> bool:
    """Whether ``password`` matches hash ``stored`` (None: no account, always False, in
    the time a real check takes)."""
    if len(password) > MAX_PASSWORD_CHARS:
        return False
    return await asyncio.to_thread(_verify, stored, password)


def needs_rehash(stored: str) -> bool:
    """The hash was made with weaker parameters than today's: store a fresh one."""
    try:
        return _hasher.check_needs_rehash(stored)
    except InvalidHashError:
        return True
