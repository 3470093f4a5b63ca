"""Tinker checkpoints as a tenant's storage (issue 46 item 4): a real API process on PostgreSQL
and a real tinker worker, driven by the official `tinker` SDK. Saving again under a name frees
the old objects; the checkpoints' bytes show in GET /v1/usage and count against the tenant's
cap (GRPO_MAX_TINKER_BYTES_PER_TENANT: a 413 naming it, or the worker's refusal once the size is
known); delete_checkpoint frees them; a TTL (save's ttl_seconds, set_checkpoint_ttl, the
ephemeral sampler weights') makes them answer as missing once past, and the worker's expiry
pass deletes them; another tenant's checkpoint answers every one of these as a missing one."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import tinker
from sqlalchemy import select
from tinker import types

from service.models import TinkerCheckpoint
from service.storage import ObjectStorage, open_storage_from_settings
from tests.e2e.services import TINY, RunningService
from tests.e2e.test_tinker_sdk import client_for
from tests.e2e.tinker_services import tinker_service

# A rank-2 checkpoint of the tiny model is ~160 kB: a handful fit, a rank-32 one (~2.2 MB) not.
CAP = 1_000_000
WAIT_S = 120  # a future the worker never finishes would hang the SDK: fail instead


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[RunningService]:
    env = {
        "GRPO_MAX_TINKER_BYTES_PER_TENANT": str(CAP),
        "GRPO_RECONCILE_SECONDS": "0.5",  # the tinker worker's expiry pass
    }
    with tinker_service(tmp_path_factory.mktemp("tinker-ckpt"), tiny_model_dir, env) as api:
        yield api


Clients = Callable[[str], tinker.ServiceClient]


@pytest.fixture()
def clients(svc: RunningService) -> Iterator[Clients]:
    """SDK clients of fresh tenants (a name each), closed after the test."""
    made: list[tinker.ServiceClient] = []

    def make(tenant: str) -> tinker.ServiceClient:
        made.append(client_for(svc, f"{tenant}-{secrets.token_hex(3)}"))
        return made[-1]

    yield make
    for client in made:
        client.close("success").result()


@pytest.fixture(scope="module")
def storage(svc: RunningService) -> ObjectStorage:
    return open_storage_from_settings(svc.settings())


def rows(svc: RunningService, run_id: str) -> dict[str, tuple[str, int]]:
    """The run's checkpoint rows, expired ones included: tinker:// path -> (object key, size)."""
    with svc.session() as session:
        found = session.scalars(select(TinkerCheckpoint).where(TinkerCheckpoint.run_id == run_id))
        segment = {"training": "weights", "sampler": "sampler_weights"}
        return {f"tinker://{run_id}/{segment[c.kind]}/{c.name}": (c.object_key, c.size_bytes)
                for c in found}  # fmt: skip


def tenant_objects(svc: RunningService, storage: ObjectStorage, run_id: str) -> set[str]:
    """Every object stored under the run's tenant (keys `tinker/<tenant>/<id>.tar`)."""
    with svc.session() as session:
        tenant = session.scalar(
            select(TinkerCheckpoint.tenant_id).where(TinkerCheckpoint.run_id == run_id).limit(1)
        )
    root = storage.path_for(f"tinker/{tenant}")  # type: ignore[attr-defined]  # LocalStorage
    return {f"tinker/{tenant}/{p.name}" for p in root.iterdir()}


def storage_bytes(svc: RunningService, client: tinker.ServiceClient, run_id: str) -> int:
    key = client.holder._api_key.removeprefix("tml-")
    with svc.client(key) as http:
        r = http.get("/v1/usage", params={"group_by": "job"})
    assert r.status_code == 200, r.text
    by_run = {row["job_id"]: row for row in r.json()["data"]}
    return by_run[run_id]["storage_bytes"] if run_id in by_run else 0


def rest_of(client: tinker.ServiceClient) -> tinker.RestClient:
    """The SDK's RestClient with the same server and key (delete, TTL, listing)."""
    return tinker.RestClient(base_url=client.holder._base_url, api_key=client.holder._api_key)


def listed(client: tinker.ServiceClient, run_id: str) -> dict[str, types.Checkpoint]:
    found = rest_of(client).list_checkpoints(run_id).result().checkpoints
    return {c.tinker_path: c for c in found}


def eventually(check: Callable[[], bool], within_s: float = 30) -> bool:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_saving_again_under_a_name_frees_the_old_objects(
    svc: RunningService, storage: ObjectStorage, clients: Clients
) -> None:
    client = clients("ckpt-overwrite")
    trainer = client.create_lora_training_client(base_model=TINY, rank=2).result()
    state = trainer.save_state("x").result(WAIT_S).path
    first = rows(svc, trainer.model_id)[state][0]
    assert trainer.save_state("x", overwrite=True).result(WAIT_S).path == state
    sampler = trainer.save_weights_for_sampler("s").result(WAIT_S).path
    assert trainer.save_weights_for_sampler("s").result(WAIT_S).path == sampler
    kept = rows(svc, trainer.model_id)
    assert set(kept) == {state, sampler} and kept[state][0] != first
    # Only the objects the rows name are left: the replaced ones were deleted.
    assert tenant_objects(svc, storage, trainer.model_id) == {k for k, _ in kept.values()}
    assert not storage.exists(first)


def test_checkpoint_bytes_show_in_usage_and_delete_frees_them(
    svc: RunningService, storage: ObjectStorage, clients: Clients
) -> None:
    client = clients("ckpt-usage")
    trainer = client.create_lora_training_client(base_model=TINY, rank=2).result()
    state = trainer.save_state("a").result(WAIT_S).path
    sampler = trainer.save_weights_for_sampler("b").result(WAIT_S).path
    sizes = {path: c.size_bytes or 0 for path, c in listed(client, trainer.model_id).items()}
    assert set(sizes) == {state, sampler} and all(sizes.values())
    assert storage_bytes(svc, client, trainer.model_id) == sum(sizes.values())

    key = rows(svc, trainer.model_id)[state][0]
    rest_of(client).delete_checkpoint_from_tinker_path(state).result()
    assert storage_bytes(svc, client, trainer.model_id) == sizes[sampler]
    assert set(listed(client, trainer.model_id)) == {sampler}
    assert eventually(lambda: not storage.exists(key))
    with pytest.raises(tinker.NotFoundError):
        client.create_training_client_from_state(state).result()


def test_a_save_past_the_tenants_cap_is_refused_naming_the_limit(
    svc: RunningService, storage: ObjectStorage, clients: Clients
) -> None:
    client = clients("ckpt-cap")
    trainer = client.create_lora_training_client(base_model=TINY, rank=2).result()
    saved = []
    with pytest.raises(tinker.APIStatusError) as refused:  # at submission
        for i in range(20):
            saved.append(trainer.save_state(f"c{i}").result(WAIT_S).path)
    assert refused.value.status_code == 413
    assert "GRPO_MAX_TINKER_BYTES_PER_TENANT" in str(refused.value), refused.value
    assert f"over the {CAP} bytes" in str(refused.value)
    assert 2 <= len(saved) < 20
    assert storage_bytes(svc, client, trainer.model_id) <= CAP

    # A run's first save has no size to judge by: the worker refuses it once it knows.
    big = client.create_lora_training_client(base_model=TINY, rank=32).result()
    with pytest.raises(tinker.RequestFailedError, match="GRPO_MAX_TINKER_BYTES_PER_TENANT"):
        big.save_state("big").result(WAIT_S)
    assert rows(svc, big.model_id) == {}

    # Deleting frees room: the next save fits again.
    rest_of(client).delete_checkpoint_from_tinker_path(saved[0]).result()
    assert trainer.save_state("again").result(WAIT_S).path.endswith("/weights/again")
    kept = rows(svc, trainer.model_id).values()
    assert tenant_objects(svc, storage, trainer.model_id) == {k for k, _ in kept}


def test_a_checkpoint_past_its_ttl_answers_as_missing_and_is_deleted(
    svc: RunningService, storage: ObjectStorage, clients: Clients
) -> None:
    client = clients("ckpt-ttl")
    rest = rest_of(client)
    trainer = client.create_lora_training_client(base_model=TINY, rank=2).result()
    brief = trainer.save_state("brief", ttl_seconds=3).result(WAIT_S).path
    kept = trainer.save_state("kept").result(WAIT_S).path
    expires = listed(client, trainer.model_id)[brief].expires_at
    assert expires is not None and expires <= datetime.now(UTC) + timedelta(seconds=3)
    assert listed(client, trainer.model_id)[kept].expires_at is None
    key = rows(svc, trainer.model_id)[brief][0]

    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.1)
    with pytest.raises(tinker.NotFoundError):
        client.create_training_client_from_state(brief).result()
    with pytest.raises(tinker.NotFoundError):
        rest.get_weights_info_by_tinker_path(brief).result()
    assert set(listed(client, trainer.model_id)) == {kept}
    # the worker's expiry pass deletes the row and the object; usage lets them go
    assert eventually(lambda: brief not in rows(svc, trainer.model_id))
    assert eventually(lambda: not storage.exists(key))
    assert storage_bytes(svc, client, trainer.model_id) == rows(svc, trainer.model_id)[kept][1]

    # set_checkpoint_ttl: a TTL set, removed, refused out of range
    rest.set_checkpoint_ttl_from_tinker_path(kept, 3600).result()
    at = listed(client, trainer.model_id)[kept].expires_at
    assert at is not None and abs((at - datetime.now(UTC)).total_seconds() - 3600) < 60
    rest.set_checkpoint_ttl_from_tinker_path(kept, None).result()
    assert listed(client, trainer.model_id)[kept].expires_at is None
    with pytest.raises(tinker.BadRequestError, match="ttl_seconds"):
        rest.set_checkpoint_ttl_from_tinker_path(kept, 0).result()
    with pytest.raises(tinker.BadRequestError, match="ttl_seconds"):
        trainer.save_state("never", ttl_seconds=10**12).result(WAIT_S)

    # the sampler weights of save_weights_and_get_sampling_client expire by themselves
    trainer.save_weights_and_get_sampling_client().result(WAIT_S)
    (ephemeral,) = (c for c in listed(client, trainer.model_id).values()
                    if c.checkpoint_type == "sampler")  # fmt: skip
    assert ephemeral.expires_at is not None
    left = (ephemeral.expires_at - datetime.now(UTC)).total_seconds()
    assert 3000 < left <= 3600  # GRPO_TINKER_EPHEMERAL_TTL_S


def test_another_tenants_checkpoint_answers_delete_and_ttl_as_a_missing_one(
    svc: RunningService, storage: ObjectStorage, clients: Clients
) -> None:
    alice, bob = clients("ckpt-alice"), clients("ckpt-bob")
    trainer = alice.create_lora_training_client(base_model=TINY, rank=2).result()
    path = trainer.save_state("mine").result(WAIT_S).path
    key = rows(svc, trainer.model_id)[path][0]
    bob_rest = rest_of(bob)
    with pytest.raises(tinker.NotFoundError):
        bob_rest.delete_checkpoint_from_tinker_path(path).result()
    with pytest.raises(tinker.NotFoundError):
        bob_rest.set_checkpoint_ttl_from_tinker_path(path, 3600).result()
    assert storage.exists(key) and listed(alice, trainer.model_id)[path].expires_at is None

    url = f"{svc.base_url}/api/v1/training_runs/{trainer.model_id}/checkpoints/weights/mine"
    bob_key = {"X-API-Key": bob.holder._api_key}

    def answers() -> list[tuple[int, str]]:
        with httpx.Client(headers=bob_key, timeout=30) as http:
            found = [http.delete(url), http.put(f"{url}/ttl", json={"ttl_seconds": 3600})]
        return [(r.status_code, r.text) for r in found]

    theirs = answers()
    rest_of(alice).delete_checkpoint_from_tinker_path(path).result()
    assert theirs == answers()  # word for word as once it is gone
    assert theirs[0][0] == theirs[1][0] == 404
