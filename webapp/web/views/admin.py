"""People, for administrators: ``/admin/users`` (SPEC §13).

Anyone but an administrator gets the same 404 as an address that does not
exist. The page lists accounts and changes them -- add, disable or enable,
reset a password, sign out everywhere -- and never shows anyone's chats:
administrators read only their own, like everyone else. Each change is a
plain form post answered with a redirect back to the list (with a notice
naming what was done), so a reload repeats nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from webapp.chats.passwords import PasswordError, hash_password_async
from webapp.chats.users import Account, UserNameError
from webapp.web.app_state import web
from webapp.web.auth import account_of
from webapp.web.forms import FormError, read_fields
from webapp.web.views.responses import error_page, path_for

NOT_HERE = "There is nothing at this address. It may have been deleted."
NO_USER = "There is no such user any more. Reload the list."
_MAX_FORM_BYTES = 16 * 1024
# What the list says after a change (the redirect names it, never free text).
NOTICES = {
    "added": "User added.",
    "disabled": "User disabled and signed out everywhere.",
    "enabled": "User enabled.",
    "password": "Password set. The user's other sessions stay open; sign them out if needed.",
    "signed-out": "User signed out everywhere.",
}

View = Callable[[Request, Account], Awaitable[Response]]


def admins_only(view: View) -> Callable[[Request], Awaitable[Response]]:
    async def guarded(request: Request) -> Response:
        account = account_of(request)
        if account is None or not account.is_admin:
            return error_page(request, 404, NOT_HERE)
        return await view(request, account)

    guarded.__doc__ = view.__doc__
    return guarded


async def _page(
    request: Request, admin: Account, *, status: int = 200, alert: str = "", name: str = ""
) -> Response:
    users = web(request).store.users
    people = await users.everyone()
    sessions = {p.id: await users.sessions_of(p.id) for p in people}
    return web(request).templates.response(
        "admin_users.html",
        status_code=status,
        people=people,
        sessions=sessions,
        me=admin,
        alert=alert,
        notice=NOTICES.get(request.query_params.get("done", ""), ""),
        user_name=name,
        passwords=web(request).auth.mode == "password",
    )


def _back(request: Request, done: str) -> Response:
    return RedirectResponse(f"{path_for(request, 'admin_users')}?done={done}", status_code=303)


@admins_only
async def users_page(request: Request, admin: Account) -> Response:
    """GET /admin/users: every account, with what can be done to it."""
    return await _page(request, admin)


@admins_only
async def add_user(request: Request, admin: Account) -> Response:
    """POST /admin/users (fields ``name``, ``password``, ``admin``)."""
    try:
        fields = await read_fields(request, _MAX_FORM_BYTES)
        password_hash = await hash_password_async(fields.get("password", ""))
        await web(request).store.users.add(
            fields.get("name", ""), password_hash, admin=fields.get("admin") == "on"
        )
    except FormError as exc:
        return await _page(request, admin, status=exc.status, alert=exc.message)
    except (UserNameError, PasswordError) as exc:
        return await _page(request, admin, status=400, alert=str(exc), name=fields.get("name", ""))
    return _back(request, "added")


async def _target(request: Request) -> Account | None:
    return await web(request).store.users.get(request.path_params["user_id"])


@admins_only
async def disable_user(request: Request, admin: Account) -> Response:
    """POST /admin/users/{user_id}/disable: no more sign-ins; every session ends now."""
    target = await _target(request)
    if target is None:
        return await _page(request, admin, status=404, alert=NO_USER)
    if target.id == admin.id:
        message = "You cannot disable your own account: another administrator can."
        return await _page(request, admin, status=400, alert=message)
    await web(request).store.users.set_disabled(target.id, True)
    return _back(request, "disabled")


@admins_only
async def enable_user(request: Request, admin: Account) -> Response:
    """POST /admin/users/{user_id}/enable."""
    target = await _target(request)
    if target is None:
        return await _page(request, admin, status=404, alert=NO_USER)
    await web(request).store.users.set_disabled(target.id, False)
    return _back(request, "enabled")


@admins_only
async def reset_password(request: Request, admin: Account) -> Response:
    """POST /admin/users/{user_id}/password (field ``password``)."""
    target = await _target(request)
    if target is None:
        return await _page(request, admin, status=404, alert=NO_USER)
    try:
        fields = await read_fields(request, _MAX_FORM_BYTES)
        password_hash = await hash_password_async(fields.get("password", ""))
    except FormError as exc:
        return await _page(request, admin, status=exc.status, alert=exc.message)
    except PasswordError as exc:
        return await _page(request, admin, status=400, alert=f"{target.name}: {exc}")
    await web(request).store.users.set_password(target.id, password_hash)
    return _back(request, "password")


@admins_only
async def sign_out_user(request: Request, admin: Account) -> Response:
    """POST /admin/users/{user_id}/sign-out: every session of the user ends now."""
    target = await _target(request)
    if target is None:
        return await _page(request, admin, status=404, alert=NO_USER)
    await web(request).store.users.sign_out_everywhere(target.id)
    return _back(request, "signed-out")
