"""Webhook endpoints in SQL: added with a new secret (handed back once, in the answer to the
add), listed and removed. Whether a URL may be added (MXQ_HOOK_ALLOWED_HOSTS, its addresses) is
decided above, by `mxq.workers.webhooks.targets`; this module stores what was decided."""

from __future__ import annotations

import secrets

from sqlalchemy import delete, select

from mxq.db.engine import rowcount, session_scope
from mxq.db.records import HookRecord, NewHook
from mxq.db.schema import Hook, HookDelivery, iso
from mxq.db.webhooks.outbox import check_events
from mxq.errors import NotFound


class HookNotFound(NotFound):
    """No webhook endpoint has that id."""


def hook_record(h: Hook) -> HookRecord:
    """An endpoint as mxq shows it: everything but its secret."""
    return {"id": h.id, "url": h.url, "events": list(h.events), "owner": h.owner,
            "enabled": h.enabled, "created_at": iso(h.created_at)}


def add_hook(url: str, hook_url: str, events: list[str], owner: str | None) -> NewHook:
    """A new endpoint and its secret (`secrets.token_urlsafe(32)`: 256 random bits), which this
    answer carries once and no later record does."""
    wanted = check_events(events)
    with session_scope(url) as session:
        hook = Hook(url=hook_url, events=wanted, secret=secrets.token_urlsafe(32), owner=owner,
                    enabled=True)
        session.add(hook)
        session.flush()
        return {**hook_record(hook), "secret": hook.secret}


def list_hooks(url: str) -> list[HookRecord]:
    with session_scope(url) as session:
        return [hook_record(h) for h in session.scalars(select(Hook).order_by(Hook.id))]


def remove_hook(url: str, hook_id: int) -> None:
    """Forget an endpoint, its secret and its deliveries (a pending one is never sent)."""
    with session_scope(url) as session:
        session.execute(delete(HookDelivery).where(HookDelivery.hook_id == hook_id))
        if not rowcount(session.execute(delete(Hook).where(Hook.id == hook_id))):
            raise HookNotFound(f"no webhook {hook_id} (`mxq hooks ls` lists them)")
