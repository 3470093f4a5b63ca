"""Evaluations from the client and the `grpo evals` CLI, on the shared trained job: its base
model and last checkpoint evaluated on the same records, read back, paged and compared."""

from __future__ import annotations

import json

import pytest

from tests.client.shared import Trained, evaluate
from tests.client.test_cli import grpo
from tests.client.test_rollouts import env  # noqa: F401, F811  (fixture: the CLI's environment)
from tests.e2e.services import TINY


def test_client_evaluates_base_and_checkpoint(trained: Trained) -> None:
    base, tuned = evaluate(trained)
    assert base.model == TINY and tuned.model.startswith("ckpt_")
    with trained.client() as grpo:
        for evaluation in (base, tuned):
            assert evaluation.status == "succeeded", evaluation
            results = evaluation.results
            assert results is not None and set(results.pass_at_k) == {"1", "2"}
            assert results.pass_at_k["1"].estimate <= results.pass_at_k["2"].estimate
            samples = list(grpo.evaluations.samples(evaluation.id, limit=3))  # every page
            assert [s.index for s in samples] == list(range(8))
            passed = sum(s.passed for s in samples) / len(samples)
            assert results.pass_at_k["1"].estimate == pytest.approx(passed)
            assert grpo.evaluations.get(evaluation.id) == evaluation
        listed = [e.id for e in grpo.evaluations.list(limit=1)]  # walks both pages
        assert listed[:2] == [tuned.id, base.id]


def test_cli_lists_gets_and_compares(trained: Trained, env: dict[str, str]) -> None:  # noqa: F811
    base, tuned = evaluate(trained)
    listed = json.loads(grpo("evals", "list", "--json", env=env).stdout)
    assert [e["id"] for e in listed][:2] == [tuned.id, base.id]
    got = json.loads(grpo("evals", "get", base.id, "--json", env=env).stdout)
    assert got["results"] == base.results.model_dump(mode="json")
    table = grpo("evals", "compare", base.id, tuned.id, env=env).stdout
    lines = {line.split()[0]: line for line in table.splitlines() if line.strip()}
    assert base.id in table and tuned.id in table and tuned.model in table
    for k in ("1", "2"):
        row = lines[f"pass@{k}"]
        for e in (base, tuned):
            assert f"{e.results.pass_at_k[k].estimate:.3f}" in row
    assert f"{base.results.reward_mean:.4f}" in lines["reward_mean"]
    assert f"{tuned.results.per_verifier['digits']:.4f}" in lines["digits"]
    bad = grpo("evals", "create", "--model", TINY, "--dataset", trained.dataset_id,
               "--verifier", "digits", "-k", "65", env=env, code=1)  # fmt: skip
    assert "$.samples_per_prompt" in bad.stderr
