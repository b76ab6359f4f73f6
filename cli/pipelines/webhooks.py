"""`mxq hooks`: signed webhooks (add, ls, rm, deliveries, redeliver).

Run on the stack's own machine, as its local admin (like `mxq users` and `mxq arch`): an
endpoint sees every user's events, so only an admin adds one (the API's `POST /hooks` too).
`add` prints the endpoint's secret once; nothing prints it again. The schedule process sends
the deliveries (docs/webhooks.md).
"""

from __future__ import annotations

from typing import Annotated

import typer

from mxq.cli import render
from mxq.cli.settings import get_settings

app = typer.Typer(help="Signed webhooks: add, ls, rm, deliveries, redeliver.", no_args_is_help=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
COLUMNS = ["id", "url", "events", "enabled", "owner", "created_at"]
DELIVERY_COLUMNS = ["id", "hook_id", "event", "status", "attempts", "last_code", "last_error",
                    "created_at", "next_attempt_at", "delivered_at"]


@app.command()
def add(url: Annotated[str, typer.Argument(help="https://HOST/PATH (its host in MXQ_HOOK_ALLOWED_HOSTS).")],
        events: Annotated[str, typer.Option(help="Comma-separated: job.finished, job.failed, version.registered, version.promoted, schedule.fire_failed, device.out, device.back.")],  # noqa: E501
        json_: JsonOpt = False) -> None:
    """Register URL for EVENTS: each is POSTed as JSON, signed with the secret printed here once
    (keep it: it is not shown again)."""
    from mxq.users import local_owner
    from mxq.workers.webhooks.sender import add_hook

    created = add_hook(get_settings(), url, events.split(","), local_owner())
    if json_:
        render.print_json(created)
        return
    render.out.print(f"added webhook {created['id']} for {', '.join(created['events'])} at "
                     f"{created['url']}\nsecret (shown once, keep it to verify signatures): "
                     f"{created['secret']}\nthe same for Standard Webhooks libraries: "
                     f"{created['standard_secret']}", markup=False, highlight=False, soft_wrap=True)


@app.command("ls")
def list_hooks(json_: JsonOpt = False) -> None:
    """Every endpoint and the events it gets (never its secret)."""
    from mxq.db.webhooks.endpoints import list_hooks as listed

    rows = listed(get_settings().database)
    if json_:
        render.print_json(rows)
    else:
        render.table([{**r, "events": ",".join(r["events"])} for r in rows], COLUMNS, "webhooks")


@app.command("rm")
def remove(hook_id: Annotated[int, typer.Argument(metavar="ID")]) -> None:
    """Forget endpoint ID, its secret and its deliveries (a pending one is never sent)."""
    from mxq.db.webhooks.endpoints import remove_hook

    remove_hook(get_settings().database, hook_id)
    render.out.print(f"removed webhook {hook_id}", markup=False, highlight=False)


@app.command()
def deliveries(hook_id: Annotated[int | None, typer.Argument(metavar="[ID]", help="One endpoint's.")] = None,
               status: Annotated[str | None, typer.Option(help="pending, delivered, failed or gave_up.")] = None,  # noqa: E501
               limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
               json_: JsonOpt = False) -> None:
    """The latest deliveries, newest first: status, attempts, the last answer."""
    from mxq.db.webhooks.outbox import list_deliveries

    rows = list_deliveries(get_settings().database, hook_id, status, limit)
    if json_:
        render.print_json(rows)
    else:
        render.table(rows, DELIVERY_COLUMNS, "webhook deliveries")


@app.command()
def redeliver(delivery_id: Annotated[str, typer.Argument(metavar="DELIVERY_ID")],
              json_: JsonOpt = False) -> None:
    """Send delivery DELIVERY_ID again now, with the same delivery id (the schedule process
    sends it within seconds; a failure is retried for a day)."""
    from mxq.db.webhooks.outbox import redeliver as again

    record = again(get_settings().database, delivery_id)
    if json_:
        render.print_json(record)
    else:
        render.out.print(f"delivery {record['id']} queued again", markup=False, highlight=False)
