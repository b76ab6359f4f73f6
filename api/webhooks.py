"""`/api/v1/hooks`: signed webhooks, an admin's only (an endpoint sees every user's events).
The answer to a create carries the endpoint's secret, once; no other answer does. Adding an
endpoint checks it against MXQ_HOOK_ALLOWED_HOSTS (`mxq.workers.webhooks.targets`); sending is
the schedule process's, so no request here waits on an endpoint."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from mxq.api.auth import settings
from mxq.api.routes import WRITE_ERRORS, Admin, problems
from mxq.api.schemas import DeliveryRecord, HookCreated, HookRecord, HookRequest
from mxq.db import records
from mxq.db.records import DELIVERY_STATUSES
from mxq.db.webhooks import endpoints, outbox
from mxq.names import MAX_ID
from mxq.workers.settings import Settings
from mxq.workers.webhooks.sender import add_hook

router = APIRouter(prefix="/api/v1")
HookId = Annotated[int, Path(ge=1, le=MAX_ID)]
DeliveryId = Annotated[str, Path(pattern=r"^dlv_[0-9a-f]{32}$")]


@router.post("/hooks", status_code=201, response_model=HookCreated,
             responses=problems(*WRITE_ERRORS))
def create_hook(req: HookRequest, who: Admin, s: Settings = Depends(settings)) -> records.HookCreated:
    """Add an endpoint for `events` (admins only): the answer's `secret` signs its deliveries and
    is shown this once. A host outside MXQ_HOOK_ALLOWED_HOSTS, or resolving to a private address
    it does not name, is refused (422)."""
    return add_hook(s, req.url, list(req.events), who.name)


@router.get("/hooks", response_model=list[HookRecord], responses=problems())
def list_hooks(_: Admin, s: Settings = Depends(settings)) -> list[records.HookRecord]:
    """Every endpoint and its events (admins only; never a secret)."""
    return endpoints.list_hooks(s.database)


@router.get("/hooks/deliveries", response_model=list[DeliveryRecord], responses=problems())
def list_deliveries(_: Admin, s: Settings = Depends(settings),
                    hook_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
                    status: Annotated[str | None, Query(pattern="^(" + "|".join(DELIVERY_STATUSES) + ")$")] = None,  # noqa: E501
                    limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> list[records.DeliveryRecord]:
    """The latest deliveries, newest first: each one's status, attempts and last answer."""
    return outbox.list_deliveries(s.database, hook_id, status, limit)


@router.post("/hooks/deliveries/{delivery_id}/redeliver", response_model=DeliveryRecord,
             responses=problems(404, *WRITE_ERRORS))
def redeliver(delivery_id: DeliveryId, _: Admin, s: Settings = Depends(settings)) -> records.DeliveryRecord:
    """Send a delivery again now, with the same delivery id (admins only)."""
    return outbox.redeliver(s.database, delivery_id)


# After the deliveries' routes, and only for a number (`:int`): `/hooks/deliveries` with another
# method is answered 405 with their methods (Allow: GET), never taken for an endpoint's id.
@router.delete("/hooks/{hook_id:int}", status_code=204, responses=problems(404, *WRITE_ERRORS))
def delete_hook(hook_id: HookId, _: Admin, s: Settings = Depends(settings)) -> Response:
    """Forget an endpoint, its secret and its deliveries (admins only)."""
    endpoints.remove_hook(s.database, hook_id)
    return Response(status_code=204)
