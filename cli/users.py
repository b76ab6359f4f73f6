"""`mxq users`: the people (and scripts) who use the API, their roles and tokens.

Run on the stack's own machine, against its database: whoever can run this is the stack's
local admin. A token is printed once, when made; only its scrypt hash is kept.
"""

from __future__ import annotations

from typing import Annotated

import typer

from mxq.cli import render
from mxq.cli.settings import get_settings
from mxq.users import Role, check_name

app = typer.Typer(help="Users of the API and their roles: add, ls, set, rm.", no_args_is_help=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
RoleOpt = Annotated[Role, typer.Option(help="read (history), submit (also its own jobs and "
                                            "schedules), admin (everything).", case_sensitive=False)]
COLUMNS = ["name", "role", "has_token", "share", "max_devices", "created_at"]
ShareOpt = Annotated[float | None, typer.Option(
    "--share", min=0.01, max=1000.0, help="Its weight against the others' when devices are contended "
    "(default 1): with weights 1 and 3, a quarter and three quarters of the device-seconds.")]
MaxDevicesOpt = Annotated[int | None, typer.Option(
    "--max-devices", min=0, max=100_000, help="At most this many devices at once; its other jobs "
    "wait, saying so (0: no quota).")]


def _name(name: str) -> str:
    try:
        return check_name(name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="NAME") from None


def _print_token(name: str, token: str) -> None:
    render.out.print(f"token of {name} (shown once; only its hash is kept):", highlight=False)
    typer.echo(token)


@app.command()
def add(name: str, role: RoleOpt = Role.SUBMIT, share: ShareOpt = None,
        max_devices: MaxDevicesOpt = None, json_: JsonOpt = False) -> None:
    """Add user NAME with ROLE (and its fair share) and print its token, once."""
    from mxq.db.sharing import users
    from mxq.shares import Share

    token = users.add(get_settings().database, _name(name), role,
                      Share(share if share is not None else 1.0, max_devices or None))
    if json_:
        render.print_json({"name": name, "role": role.value, "token": token})
    else:
        _print_token(name, token)


@app.command("ls")
def list_users(json_: JsonOpt = False) -> None:
    """Every user with its role (never a token)."""
    from mxq.db.sharing import users

    rows = users.list_users(get_settings().database)
    if json_:
        render.print_json(rows)
    else:
        render.table(rows, COLUMNS, "users")


@app.command("set")
def set_user(name: str, role: Annotated[Role | None, typer.Option(
                 help="The new role.", case_sensitive=False)] = None,
             new_token: Annotated[bool, typer.Option(
                 "--new-token", help="Replace its token: the old one stops working.")] = False,
             share: ShareOpt = None, max_devices: MaxDevicesOpt = None,
             json_: JsonOpt = False) -> None:
    """Change user NAME's role, share or quota, or give it a new token."""
    from mxq.db.sharing import users

    if role is None and not new_token and share is None and max_devices is None:
        raise typer.BadParameter("nothing to change: give --role ROLE, --share W, --max-devices N "
                                 "or --new-token")
    token = users.set_user(get_settings().database, name, role, new_token, share, max_devices)
    if json_:
        render.print_json({"name": name, **({"role": role.value} if role else {}),
                           **({"token": token} if token else {})})
    elif token is not None:
        _print_token(name, token)
    else:
        render.table([r for r in users.list_users(get_settings().database) if r["name"] == name],
                     COLUMNS, f"user {name}")


@app.command("rm")
def remove(name: str) -> None:
    """Remove user NAME: its token stops working; what it owns keeps its name."""
    from mxq.db.sharing import users

    users.remove(get_settings().database, name)
    render.out.print(f"user {name} removed")
