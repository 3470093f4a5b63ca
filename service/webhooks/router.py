from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response
from sqlalchemy import select

from service.core.pagination import Page, PageDep, paginate
from service.http.deps import SessionDep, SettingsDep, TenantDep
from service.http.idempotency import Idempotent, IdempotentRoute, replayed_without
from service.http.openapi import problems
from service.models import Webhook, WebhookDelivery
from service.webhooks import service
from service.webhooks.schemas import DeliveryOut, WebhookCreate, WebhookCreated, WebhookOut

router = APIRouter(
    prefix="/v1/webhooks",
    tags=["webhooks"],
    route_class=IdempotentRoute,
    responses=problems(400, 401, 422, 500),
)


def load_webhook(
    webhook_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_]{1,64}$")],
    session: SessionDep,
    tenant: TenantDep,
) -> Webhook:
    return service.find(session, tenant, webhook_id)


WebhookDep = Annotated[Webhook, Depends(load_webhook)]


def _out(row: Webhook) -> WebhookOut:
    return WebhookOut.model_validate(row, from_attributes=True)


def _delivery(row: WebhookDelivery) -> DeliveryOut:
    out = DeliveryOut.model_validate(row, from_attributes=True)
    return out if row.status == "pending" else out.model_copy(update={"next_attempt_at": None})


@router.post(
    "",
    status_code=201,
    response_model=WebhookCreated,
    dependencies=[Idempotent],
    responses=problems(409, 413, 429, 503),
)
@replayed_without("secret")
def create_webhook(
    body: WebhookCreate, session: SessionDep, tenant: TenantDep, settings: SettingsDep
) -> WebhookCreated:
    """Subscribe a URL to job events. The answer holds the signing secret (`whsec_…`), shown
    this once: a retry with the same Idempotency-Key replays the answer with `secret: null`
    (the idempotency store never holds the secret); delete that webhook and create another."""
    row, secret = service.create(session, settings, tenant, body)
    return WebhookCreated(**_out(row).model_dump(), secret=secret)


@router.get("", response_model=Page[WebhookOut])
def list_webhooks(session: SessionDep, tenant: TenantDep, page: PageDep) -> Page[WebhookOut]:
    stmt = select(Webhook).where(Webhook.tenant_id == tenant)
    rows, has_more, nxt = paginate(session, stmt, Webhook.id, page)
    return Page[WebhookOut](data=[_out(r) for r in rows], has_more=has_more, next=nxt)


# Registered before GET/DELETE /{webhook_id}: the OpenAPI document, walked in order by the
# tenancy test, then lists the delete last.
@router.get("/{webhook_id}/deliveries", response_model=Page[DeliveryOut], responses=problems(404))
def list_deliveries(webhook: WebhookDep, session: SessionDep, page: PageDep) -> Page[DeliveryOut]:
    """The delivery log, newest first: each message's attempts, last answer and next try."""
    stmt = select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook.id)
    rows, has_more, nxt = paginate(session, stmt, WebhookDelivery.id, page)
    return Page[DeliveryOut](data=[_delivery(r) for r in rows], has_more=has_more, next=nxt)


@router.post(
    "/{webhook_id}/test", status_code=202, response_model=DeliveryOut, responses=problems(404)
)
def test_webhook(webhook: WebhookDep, session: SessionDep) -> DeliveryOut:
    """Queue a `webhook.test` delivery; follow it in the delivery log."""
    return _delivery(service.queue_test(session, webhook))


@router.get("/{webhook_id}", response_model=WebhookOut, responses=problems(404))
def get_webhook(webhook: WebhookDep) -> WebhookOut:
    return _out(webhook)


@router.delete("/{webhook_id}", status_code=204, responses=problems(404))
def delete_webhook(webhook: WebhookDep, session: SessionDep) -> Response:
    service.remove(session, webhook)
    return Response(status_code=204)
