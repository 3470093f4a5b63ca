"""Tenant secrets over real HTTP: write-only (no value in any response), replaced in place,
deleted, invisible to other tenants, stored as Fernet ciphertext; and the job-spec checks of
`report_to` and the secrets a job names."""

from __future__ import annotations

import os
import stat

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.api.conftest import tenant_client
from tests.api.helpers import error_paths, job_body, make_dataset, make_verifier, problem
from tests.e2e.services import RunningService

VALUE = "wandb-key-0123456789abcdef-do-not-show"


@pytest.fixture(scope="module")
def owner(api: RunningService) -> httpx.Client:
    client = tenant_client(api)
    r = client.post("/v1/secrets", json={"name": "wandb", "value": VALUE})
    assert r.status_code == 200, r.text
    return client


def _ciphertext(api: RunningService, client: httpx.Client, name: str) -> bytes:
    """The stored column of the client's tenant's secret, read from the database itself."""
    tenant = client.get("/v1/me").json()["tenant_id"]
    engine = create_engine(api.settings().effective_database_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                text("SELECT ciphertext FROM tenant_secrets WHERE tenant_id = :t AND name = :n"),
                {"t": tenant, "n": name},
            ).one()
    finally:
        engine.dispose()
    return bytes(row[0])


def test_create_answers_names_and_dates_never_the_value(owner: httpx.Client) -> None:
    r = owner.post("/v1/secrets", json={"name": "other.key_1", "value": "v"})
    assert r.status_code == 200 and set(r.json()) == {"name", "created_at", "updated_at"}
    assert r.json()["name"] == "other.key_1"
    listed = owner.get("/v1/secrets")
    assert listed.status_code == 200
    assert {s["name"] for s in listed.json()["data"]} == {"wandb", "other.key_1"}
    assert set(listed.json()) == {"data", "has_more", "next"}
    assert VALUE not in listed.text and all(set(s) == {"name", "created_at", "updated_at"}
                                            for s in listed.json()["data"])  # fmt: skip


def test_replace_keeps_the_secret_and_moves_updated_at(api: RunningService) -> None:
    client = tenant_client(api)
    first = client.post("/v1/secrets", json={"name": "k", "value": "one"}).json()
    before = _ciphertext(api, client, "k")
    r = client.post("/v1/secrets", json={"name": "k", "value": "two"})
    assert r.status_code == 200, r.text
    assert r.json()["created_at"] == first["created_at"]
    assert r.json()["updated_at"] > first["updated_at"]
    assert [s["name"] for s in client.get("/v1/secrets").json()["data"]] == ["k"]
    assert _ciphertext(api, client, "k") != before


def test_stored_as_ciphertext_under_a_0600_key_file(
    api: RunningService, owner: httpx.Client
) -> None:
    from cryptography.fernet import Fernet

    stored = _ciphertext(api, owner, "wandb")
    assert VALUE.encode() not in stored and b"wandb-key" not in stored
    key_file = api.settings().data_path / "secrets.key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert VALUE in Fernet(key_file.read_bytes()).decrypt(stored).decode()


def test_delete_then_it_is_gone(api: RunningService) -> None:
    client = tenant_client(api)
    assert client.post("/v1/secrets", json={"name": "gone", "value": "x"}).status_code == 200
    assert client.delete("/v1/secrets/gone").status_code == 204
    assert client.get("/v1/secrets").json()["data"] == []
    problem(client.delete("/v1/secrets/gone"), 404)


def test_another_tenants_secret_is_missing(api: RunningService, owner: httpx.Client) -> None:
    stranger = tenant_client(api)
    assert stranger.get("/v1/secrets").json()["data"] == []
    missing = problem(stranger.delete("/v1/secrets/nope"), 404)
    theirs = problem(stranger.delete("/v1/secrets/wandb"), 404)
    assert theirs["detail"] == missing["detail"].replace("nope", "wandb")
    assert [s["name"] for s in owner.get("/v1/secrets").json()["data"]].count("wandb") == 1


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"name": "has space", "value": "v"}, "$.name"),
        ({"name": "a/b", "value": "v"}, "$.name"),
        ({"name": "x" * 101, "value": "v"}, "$.name"),
        ({"name": "", "value": "v"}, "$.name"),
        ({"name": "ok", "value": ""}, "$.value"),
        ({"name": "ok", "value": "v" * 8193}, "$.value"),
        ({"name": "ok", "value": "v", "extra": 1}, "$.extra"),
    ],
)
def test_bad_secrets_are_422_with_the_field(
    owner: httpx.Client, body: dict[str, object], path: str
) -> None:
    r = owner.post("/v1/secrets", json=body)
    problem(r, 422)
    assert error_paths(r) == [path]
    assert "v" * 100 not in r.text  # the value is never echoed back


def test_a_bad_name_in_the_path_is_422(owner: httpx.Client) -> None:
    r = owner.delete("/v1/secrets/bad%20name")
    problem(r, 422)
    assert error_paths(r) == ["path.name"]


@pytest.fixture(scope="module")
def dataset(owner: httpx.Client) -> str:
    make_verifier(owner)
    return make_dataset(owner)


@pytest.mark.parametrize(
    ("extra", "paths"),
    [
        ({"report_to": ["tensorboard", "tensorboard"]}, ["$.report_to[1]"]),
        ({"report_to": ["wandb", "comet"]}, ["$.report_to[1]"]),
        ({"report_to": ["tensorboard", "mlflow"]}, ["$.report_to[1]"]),  # no MLflow server
        ({"report_to": ["wandb"], "wandb_secret": "missing"}, ["$.wandb_secret"]),
        ({"report_to": ["trackio"], "trackio_secret": "bad name"}, ["$.trackio_secret"]),
    ],
)
def test_bad_trackers_are_refused_at_submission(
    owner: httpx.Client, dataset: str, extra: dict[str, object], paths: list[str]
) -> None:
    r = owner.post("/v1/jobs", json=job_body(dataset, **extra))
    problem(r, 422)
    assert error_paths(r) == paths


def test_a_job_names_only_its_own_tenants_secrets(api: RunningService, owner: httpx.Client) -> None:
    stranger = tenant_client(api)
    make_verifier(stranger)
    theirs = stranger.post("/v1/jobs", json=job_body(make_dataset(stranger), wandb_secret="wandb"))
    problem(theirs, 422)
    assert error_paths(theirs) == ["$.wandb_secret"]


def test_a_job_with_trackers_and_its_secret_is_accepted(owner: httpx.Client, dataset: str) -> None:
    extra = {"report_to": ["wandb", "tensorboard"], "wandb_secret": "wandb", "tracker_project": "p"}
    r = owner.post("/v1/jobs", json=job_body(dataset, **extra))
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert spec["report_to"] == ["wandb", "tensorboard"] and spec["wandb_secret"] == "wandb"
    assert VALUE not in r.text
    assert owner.post(f"/v1/jobs/{r.json()['id']}/cancel").status_code == 202
