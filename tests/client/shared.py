"""One embedded service and one short finished job for the client, CLI, dashboard and report
tests (tests/client, tests/ui). A session fixture imported into two conftest files would start
two services, so the fixtures below keep theirs in a module-level cache instead."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from grpo_client import Client
from grpo_client.models_generated import EvaluationOut
from service.demo_task import DIGIT_VERIFIER_SOURCE, digit_records
from tests.e2e.services import TINY, RunningService, run_service

STEPS = 3


@dataclass
class Trained:
    svc: RunningService
    key: str
    job_id: str
    dataset_id: str
    model: Path

    def client(self) -> Client:
        return Client(self.svc.base_url, self.key)


_cache: dict[str, Any] = {}


def job_spec(dataset_id: str, **overrides: Any) -> dict[str, Any]:
    return {
        "base_model": TINY,
        "dataset": dataset_id,
        "eval_dataset": dataset_id,
        "eval_every": 1,
        "verifiers": [{"name": "digits"}],
        "grpo": {"steps": STEPS, "prompts_per_step": 2, "group_size": 2, "learning_rate": 1e-3},
        "generation": {"max_new_tokens": 6},
        "checkpoint_every": 1,
        **overrides,
    }


def _start(tmp: pytest.TempPathFactory, model: Path) -> Trained:
    stack = ExitStack()
    _cache["stack"] = stack
    # with its inference server: the dashboard's playground asks the base and a checkpoint
    svc = stack.enter_context(
        run_service({}, tmp.mktemp("clientside"), embedded=True, model=model, serve=True)
    )
    key = svc.new_key("clientside")
    with Client(svc.base_url, key) as grpo:
        grpo.verifiers.create_python("digits", DIGIT_VERIFIER_SOURCE)
        ds = grpo.datasets.create("digits", digit_records(16))
        job = grpo.jobs.create(job_spec(ds.id))
    return Trained(svc, key, job.id, ds.id, model)


@pytest.fixture(scope="session")
def clientside(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, request: pytest.FixtureRequest
) -> Iterator[Trained]:
    """The service with a job submitted (maybe still running)."""
    if "trained" not in _cache:
        _cache["trained"] = _start(tmp_path_factory, tiny_model_dir)
        request.addfinalizer(_cache["stack"].close)
    yield _cache["trained"]


@pytest.fixture(scope="session")
def trained(clientside: Trained) -> Trained:
    """The same, once the job has succeeded."""
    with clientside.client() as grpo:
        job = grpo.jobs.wait(clientside.job_id, timeout=300)
    assert job.status == "succeeded", (job, clientside.svc.logs())
    return clientside


def evaluate(trained: Trained) -> list[EvaluationOut]:
    """Evaluations of the trained job's base model and of its last checkpoint on the same
    records (made once, for the client, CLI and dashboard tests)."""
    if "evaluations" not in _cache:
        with trained.client() as grpo:
            last = grpo.checkpoints.get(trained.job_id, "latest")
            same = {"dataset": trained.dataset_id, "verifiers": [{"name": "digits"}],
                    "samples_per_prompt": 2, "max_records": 4,
                    "generation": {"max_new_tokens": 6}, "pass_threshold": 0.5}  # fmt: skip
            made = [grpo.evaluations.create({"model": m, **same}) for m in (TINY, last.id)]
            _cache["evaluations"] = [grpo.evaluations.wait(e.id, timeout=300, poll_interval=0.3)
                                     for e in made]  # fmt: skip
    return _cache["evaluations"]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
