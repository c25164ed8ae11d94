"""Who is asking: the four ways in (SPEC §13), as Starlette authentication backends.

- ``none`` and ``token``: the app has no accounts; every request that gets
  past the access token (`webapp.web.security`) is the one implicit user,
  who owns every chat (`EVERY_CHAT`).
- ``password``: the session cookie names a row of ``user_sessions``; each
  request reads it (with its account), so a sign-out, a disable or a
  sign-out-everywhere ends the session at once, in every process.
- ``header``: a proxy that signed the person in (oauth2-proxy, Authelia ...)
  names them in a header. The header counts only on connections whose own
  peer address is one of ``trusted_proxies``: `TrustedHeaderGate` removes it
  from every other request before anything reads it, ahead of the
  ``X-Forwarded-For`` rewrite (which would otherwise let a request claim the
  proxy's address). A name seen for the first time becomes an account.

The backends go into Starlette's `AuthenticationMiddleware`, so a view reads
``request.user``; `owner_of` turns it into the chat layer's `Owner`. What an
anonymous request may reach is `webapp.web.gate`'s business.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal, get_args

from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    BaseUser,
)
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from webapp.chats.shares import SHARE_MODES
from webapp.chats.users import EVERY_CHAT, Account, Owner, UserNameError, Users

AuthMode = Literal["none", "token", "password", "header"]
AUTH_MODES: tuple[str, ...] = get_args(AuthMode)
SESSION_COOKIE = "webapp_session"
DEFAULT_HEADER = "X-Forwarded-User"
SHARED_PAGE = re.compile(r"^/s/[^/]+$")  # a shared page itself, not what is done from it
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def networks(values: tuple[str, ...] | list[str]) -> tuple[IpNetwork, ...]:
    """Addresses and CIDRs (``127.0.0.1``, ``10.0.0.0/8``, ``::1``) as networks;
    `ValueError` naming the one that is neither."""
    found = []
    for value in values:
        try:
            found.append(ipaddress.ip_network(value.strip().strip("[]"), strict=False))
        except ValueError:
            raise ValueError(
                f"{value!r} is not an IP address or CIDR block (such as 127.0.0.1/32 or 10.0.0.0/8)"
            ) from None
    return tuple(found)


@dataclass(frozen=True)
class AuthSettings:
    """How the app knows who is asking.

    ``trusted_proxies``: the peer addresses (CIDRs) whose ``X-Forwarded-For``
    and ``X-Forwarded-Proto`` the app believes -- and, in header mode, whose
    ``header`` names the person. Required for header mode.
    """

    mode: AuthMode = "none"
    header: str = DEFAULT_HEADER
    trusted_proxies: tuple[str, ...] = ()
    share_links: str = "signed-in"  # who may open a share link: one of SHARE_MODES

    def __post_init__(self) -> None:
        if self.mode not in AUTH_MODES:
            raise ValueError(f"auth mode must be one of {', '.join(AUTH_MODES)}; got {self.mode!r}")
        networks(self.trusted_proxies)
        if self.share_links not in SHARE_MODES:
            raise ValueError(
                f"share links must be one of {', '.join(SHARE_MODES)}; got {self.share_links!r}"
            )
        if self.mode == "header" and not self.trusted_proxies:
            raise ValueError(
                "header sign-in needs the proxy's addresses (trusted_proxies, "
                "--trusted-proxies): a header from anywhere else would let anyone in"
            )
        if self.mode == "header" and not self.header.strip():
            raise ValueError("header sign-in needs the header's name (--auth-header)")

    def public_path(self, path: str) -> bool:
        """Whether ``path`` is open to anyone, signed in or not: a shared page, when
        share links are open to ``anyone`` (SPEC §15)."""
        return self.share_links == "anyone" and bool(SHARED_PAGE.match(path))

    @property
    def accounts(self) -> bool:
        """Whether people have accounts of their own (password or header mode)."""
        return self.mode in ("password", "header")


class SignedIn(BaseUser):
    """A person with an account."""

    def __init__(self, account: Account) -> None:
        self.account = account

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def display_name(self) -> str:
        return self.account.name

    @property
    def identity(self) -> str:
        return self.account.id


class SoleUser(BaseUser):
    """The one implicit user of an app without accounts."""

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def display_name(self) -> str:
        return ""

    @property
    def identity(self) -> str:
        return ""


def owner_of(conn: HTTPConnection) -> Owner:
    """The `Owner` a request acts for. Refuses (`PermissionError`) a request no
    backend let in: the gate answers those before any view runs."""
    user = conn.user
    if isinstance(user, SignedIn):
        return user.account.owner
    if isinstance(user, SoleUser):
        return EVERY_CHAT
    raise PermissionError("an anonymous request reached a view that needs a person")


def account_of(conn: HTTPConnection) -> Account | None:
    user = conn.scope.get("user")
    return user.account if isinstance(user, SignedIn) else None


def _credentials(account: Account) -> tuple[AuthCredentials, BaseUser]:
    scopes = ["authenticated", "admin"] if account.is_admin else ["authenticated"]
    return AuthCredentials(scopes), SignedIn(account)


class NoAccounts(AuthenticationBackend):
    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser]:
        return AuthCredentials(["authenticated"]), SoleUser()


class SessionCookie(AuthenticationBackend):
    """Password mode: the session the cookie names, if it is still open."""

    def __init__(self, users: Users, public: tuple[str, ...]) -> None:
        self.users = users
        self.public = public  # path prefixes that need no session (no read for them)

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        token = conn.cookies.get(SESSION_COOKIE)
        if not token or conn.url.path.startswith(self.public):
            return None
        account = await self.users.session(token)
        return _credentials(account) if account is not None else None


class TrustedHeader(AuthenticationBackend):
    """Header mode: the person the proxy names (the gate removed any header it did
    not send). A disabled account is refused with 403."""

    def __init__(self, users: Users, header: str) -> None:
        self.users = users
        self.header = header

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        name = conn.headers.get(self.header, "").strip()
        if not name:
            return None
        try:
            account = await self.users.on_first_sight(name)
        except UserNameError as exc:
            raise AuthenticationError(f"The proxy named a user this app cannot take: {exc}")
        if account.disabled:
            raise AuthenticationError("This account is disabled. Ask an administrator.")
        return _credentials(account)


class TrustedHeaderGate:
    """Drops the identity header from any request whose connection does not come
    from a trusted proxy; it runs before anything else reads the request."""

    def __init__(self, app: ASGIApp, *, header: str, trusted: tuple[str, ...]) -> None:
        self.app = app
        self.header = header.lower().encode("latin-1")
        self.trusted = networks(trusted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._trusted(scope.get("client")):
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != self.header]
        await self.app(scope, receive, send)

    def _trusted(self, client: tuple[str, int] | None) -> bool:
        if client is None:
            return False
        try:
            address = ipaddress.ip_address(client[0])
        except ValueError:
            return False  # a unix socket's peer, say: not a proxy we were told of
        return any(address in network for network in self.trusted)


def set_session_cookie(response: Response, conn: HTTPConnection, token: str, days: int) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=days * 86400,
        httponly=True,
        samesite="lax",
        secure=conn.url.scheme == "https",
        path="/",
    )


def clear_session_cookie(response: Response, conn: HTTPConnection) -> None:
    response.delete_cookie(
        SESSION_COOKIE, httponly=True, samesite="lax", secure=conn.url.scheme == "https", path="/"
    )
