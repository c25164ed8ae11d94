"""Signing in with a name and a password: throttled, and silent about which was wrong.

One function, `sign_in`, returns a small outcome the sign-in page turns into
a response. The order of its steps is the point:
1. the attempt is counted against the name and the address first (one
   statement each), so guesses sent in parallel are all counted;
2. a name or address over its limit is refused before any password is
   checked: no answer during the refusal says whether a guess was right;
3. the password is checked the same way whether the account exists, is
   disabled or is fine, so neither the message nor the time says which;
4. only a right password for an enabled account opens a session -- a new
   session id, the one the browser came with ended.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Union

from webapp.chats.passwords import hash_password_async, needs_rehash, verify_password
from webapp.chats.users import Account, UserNameError, Users, user_name


@dataclass(frozen=True)
class SignedIn:
    account: Account
    token: str  # the new session's cookie value


@dataclass(frozen=True)
class WrongCredentials:
    """No enabled account has that name and password; deliberately not saying which."""


@dataclass(frozen=True)
class Throttled:
    until: float  # seconds since 1970 at which attempts are taken again


SignInOutcome = Union[SignedIn, WrongCredentials, Throttled]


async def sign_in(
    users: Users, name: str, password: str, address: str, *, replacing: str | None = None
) -> SignInOutcome:
    try:
        normal = user_name(name)
    except UserNameError:
        normal = " ".join(name.split()).lower()[:64]  # no account has it; still counted
    attempt = await users.attempt(normal, address)
    if attempt.refused_until is not None:
        return Throttled(attempt.refused_until)
    if attempt.delay:
        await asyncio.sleep(attempt.delay)
    found = await users.password_hash(normal)
    account, stored = found if found is not None else (None, None)
    right = await verify_password(stored, password)
    if account is None or account.disabled or not right or stored is None:
        return WrongCredentials()
    await users.succeeded(normal, address)
    if needs_rehash(stored):
        await users.set_password(account.id, await hash_password_async(password))
    return SignedIn(account, await users.open_session(account.id, replacing=replacing))
