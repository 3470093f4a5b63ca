"""Webhooks over the API alone (no dispatcher runs here): creation and its checks (SSRF,
events, the per-tenant limit), the secret shown once, tenancy, the delivery log of a test."""

from __future__ import annotations

import base64
import json
import os

import httpx
import pytest

from tests.api.conftest import tenant_client
from tests.client.test_cli import grpo
from tests.e2e.services import RunningService

PUBLIC = "https://93.184.215.14/hooks/grpo"  # a public address literal: no DNS needed here


def _create(client: httpx.Client, url: str = PUBLIC, **extra: object) -> httpx.Response:
    return client.post("/v1/webhooks", json={"url": url, "events": ["job.succeeded"], **extra})


def test_create_shows_the_secret_once(client: httpx.Client) -> None:
    r = _create(client, events=["job.succeeded", "job.checkpoint", "job.succeeded"])
    assert r.status_code == 201, r.text
    hook = r.json()
    assert hook["id"].startswith("wh_") and hook["url"] == PUBLIC
    assert hook["events"] == ["job.succeeded", "job.checkpoint"]
    secret = hook["secret"]
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) >= 24
    listed = client.get("/v1/webhooks").json()["data"]
    assert [h["id"] for h in listed] == [hook["id"]]
    got = client.get(f"/v1/webhooks/{hook['id']}")
    assert got.status_code == 200 and "secret" not in got.json() and "secret" not in listed[0]
    assert secret[6:] not in got.text + client.get("/v1/webhooks").text
    assert client.delete(f"/v1/webhooks/{hook['id']}").status_code == 204
    assert client.get(f"/v1/webhooks/{hook['id']}").status_code == 404
    assert client.get("/v1/webhooks").json()["data"] == []


def test_a_replayed_creation_answers_without_the_secret_and_never_stores_it(
    api: RunningService, client: httpx.Client
) -> None:
    """The idempotency store keeps the first answer for 24 h: with `secret` nulled, so the
    plain secret is in no table; the retry learns the webhook exists and must recreate it."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from service.core.db import make_engine
    from service.models import IdempotencyKey

    key = {"Idempotency-Key": os.urandom(8).hex()}
    first = client.post("/v1/webhooks", json={"url": PUBLIC, "events": ["*"]}, headers=key)
    again = client.post("/v1/webhooks", json={"url": PUBLIC, "events": ["*"]}, headers=key)
    assert first.status_code == again.status_code == 201, (first.text, again.text)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == {**first.json(), "secret": None}
    assert first.json()["secret"].startswith("whsec_")
    engine = make_engine(api.settings().effective_database_url)
    with Session(engine) as s:
        stored = s.scalar(
            select(IdempotencyKey.response).where(IdempotencyKey.key == key["Idempotency-Key"])
        )
    engine.dispose()
    assert stored is not None and stored["secret"] is None
    assert first.json()["secret"][6:] not in json.dumps(stored)
    assert client.delete(f"/v1/webhooks/{first.json()['id']}").status_code == 204


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hook",
        "https://10.1.2.3/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/hook",
        "https://[::ffff:10.0.0.1]/hook",  # IPv4-mapped IPv6
        "https://localhost/hook",  # a name that resolves to loopback
        "https://0.0.0.0/hook",
        "http://93.184.215.14/hook",  # plain http: only with private targets allowed
        "https://user:pw@93.184.215.14/hook",
        "not a url",
    ],
)
def test_unsafe_targets_are_refused_naming_the_url(client: httpx.Client, url: str) -> None:
    r = _create(client, url)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert [e["path"] for e in r.json()["errors"]] == ["$.url"]


def test_an_unresolvable_host_is_refused_exactly_as_a_private_one(client: httpx.Client) -> None:
    """No oracle for the operator's internal DNS: a name that does not resolve, a name that
    resolves to loopback and a private address answer alike, the host as written aside."""
    hosts = ("no-such-host.invalid", "localhost", "10.1.2.3")
    answers = set()
    for host in hosts:
        r = _create(client, f"https://{host}/hook")
        assert r.status_code == 422, r.text
        answers.add((r.status_code, r.headers["content-type"], r.text.replace(host, "HOST")))
    assert len(answers) == 1, answers


def test_unknown_events_are_refused_naming_the_field(client: httpx.Client) -> None:
    r = client.post("/v1/webhooks", json={"url": PUBLIC, "events": ["job.queued", "job.exploded"]})
    assert r.status_code == 422, r.text
    assert [e["path"] for e in r.json()["errors"]] == ["$.events[1]"]
    r = client.post("/v1/webhooks", json={"url": PUBLIC, "events": []})
    assert r.status_code == 422 and r.json()["errors"][0]["path"] == "$.events"


def test_a_tenant_may_have_so_many_webhooks(api: RunningService) -> None:
    client = tenant_client(api)
    limit = api.settings().max_webhooks_per_tenant
    for _ in range(limit):
        assert _create(client).status_code == 201
    r = _create(client)
    assert r.status_code == 429 and "delete some" in r.json()["detail"]


def test_a_test_delivery_is_queued_in_the_log(client: httpx.Client) -> None:
    hook = _create(client).json()
    r = client.post(f"/v1/webhooks/{hook['id']}/test")
    assert r.status_code == 202, r.text
    queued = r.json()
    assert queued["id"].startswith("msg_") and queued["event_type"] == "webhook.test"
    assert queued["status"] == "pending" and queued["attempts"] == 0 and queued["next_attempt_at"]
    log = client.get(f"/v1/webhooks/{hook['id']}/deliveries").json()
    assert [d["id"] for d in log["data"]] == [queued["id"]] and log["has_more"] is False


def test_another_tenants_webhook_looks_missing(api: RunningService) -> None:
    owner, stranger = tenant_client(api), tenant_client(api)
    hook_id = _create(owner).json()["id"]
    missing = "wh_0000000000000000000000"
    for method, suffix in [("GET", ""), ("GET", "/deliveries"), ("POST", "/test"), ("DELETE", "")]:
        theirs = stranger.request(method, f"/v1/webhooks/{hook_id}{suffix}")
        absent = stranger.request(method, f"/v1/webhooks/{missing}{suffix}")
        assert theirs.status_code == absent.status_code == 404, (method, suffix)
        assert theirs.json()["detail"].replace(hook_id, "ID") == absent.json()["detail"].replace(
            missing, "ID"
        )
    assert stranger.get("/v1/webhooks").json()["data"] == []
    assert owner.get(f"/v1/webhooks/{hook_id}").status_code == 200  # the DELETE did nothing
    assert owner.get(f"/v1/webhooks/{hook_id}/deliveries").json()["data"] == []


def test_the_grpo_cli_manages_webhooks(api_http: RunningService) -> None:
    api = api_http  # the CLI is a process of its own
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    env = {**base, "GRPO_URL": api.base_url, "GRPO_API_KEY": api.new_key("cli-hooks")}
    made = json.loads(
        grpo("webhooks", "create", PUBLIC, "-e", "job.failed", "--json", env=env).stdout
    )
    assert made["secret"].startswith("whsec_") and made["events"] == ["job.failed"]
    listed = grpo("webhooks", "list", env=env).stdout
    assert made["id"] in listed and made["secret"] not in listed
    queued = json.loads(grpo("webhooks", "test", made["id"], "--json", env=env).stdout)
    log = json.loads(grpo("webhooks", "deliveries", made["id"], "--json", env=env).stdout)
    assert [d["id"] for d in log] == [queued["id"]]
    grpo("webhooks", "delete", made["id"], env=env)
    grpo("webhooks", "deliveries", made["id"], env=env, code=1)  # gone: a 404
