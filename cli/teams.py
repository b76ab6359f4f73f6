"""`mxq teams`: teams of users. What a job, schedule or model is shared with (`--team`) is read
by the team's members; a user belongs to several teams.

Run on the stack's own machine, against its database, as its local admin (like `mxq users`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from mxq.cli import render
from mxq.cli.settings import get_settings
from mxq.users import check_name

app = typer.Typer(help="Teams of users: add, ls, join, leave, rm.", no_args_is_help=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def _name(name: str, what: str = "team name") -> str:
    try:
        return check_name(name, what)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="NAME") from None


@app.command()
def add(name: str, members: Annotated[list[str] | None, typer.Argument(
        help="Users to add to it.")] = None) -> None:
    """Add team NAME (with MEMBERS)."""
    from mxq.db.sharing import teams

    url = get_settings().database
    teams.add_team(url, _name(name))
    for user in members or []:
        teams.set_member(url, name, user)
    render.out.print(f"team {name} added", highlight=False)


@app.command("ls")
def list_teams(json_: JsonOpt = False) -> None:
    """Every team with its members."""
    from mxq.db.sharing import teams

    rows = teams.list_teams(get_settings().database)
    if json_:
        render.print_json(rows)
    else:
        render.table([{**r, "members": ", ".join(r["members"])} for r in rows],
                     ["name", "members", "created_at"], "teams")


@app.command()
def join(team: str, user: str) -> None:
    """Add USER to TEAM: it reads what is shared with TEAM from now on."""
    from mxq.db.sharing import teams

    teams.set_member(get_settings().database, team, user)
    render.out.print(f"{user} is a member of {team}", highlight=False)


@app.command()
def leave(team: str, user: str) -> None:
    """Take USER out of TEAM: it reads no more of what is shared with TEAM alone."""
    from mxq.db.sharing import teams

    teams.set_member(get_settings().database, team, user, member=False)
    render.out.print(f"{user} left {team}", highlight=False)


@app.command("rm")
def remove(name: str) -> None:
    """Remove team NAME: what was shared with it is its owners' (and admins') alone again."""
    from mxq.db.sharing import teams

    teams.remove_team(get_settings().database, name)
    render.out.print(f"team {name} removed", highlight=False)
