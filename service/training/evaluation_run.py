"""An evaluation's run (docs/evaluations.md): `python -m service.training.evaluation_run
EVALUATION_ID EPOCH SUPERVISOR_PID`, a fresh interpreter started by the run supervisor
(`supervisor.py`, kind `kinds.EVALUATION`) that claimed the row under a lease in the Celery pool
process; that process renews the lease, and kills this one (with its verifier sandboxes) when a
cancel is not honoured within the grace, the lease is lost, or a batch runs past its budget.

The run loads the weights as a job would (`weights_for`: catalog model, checkpoint or adapter
chain), samples and scores through the engine (`workers.grpo.model_eval`) with the pinned
verifiers (`open_scorers`, the sandbox included), stores each batch's samples fenced on its
epoch, beacons each batch (`progress.py`: the first batch within the start-up budget, each later
one within the step budget), stops at a batch boundary once cancelled, and writes the results.
SIGTERM (the worker shutting down) hands the row back: the lease lapses and the reconciler
requeues it; the next claim starts over, its first write dropping earlier epochs' samples.
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from service.core.db import session_scope
from service.core.leases import LeaseLost
from service.evaluations import rows
from service.evaluations.results import summarize
from service.models import Evaluation, EvaluationSample
from service.process_group import exit_now
from service.settings import Settings, get_settings
from service.storage import open_storage_from_settings
from service.training import child, resume
from service.training.child import DONE, LEFT_TO_RECONCILER
from service.training.progress import Beacon
from service.training.scorers import open_scorers
from service.training.uploads import error_code
from service.training.weights import weights_for
from service.usage import budget

log = logging.getLogger(__name__)


class BudgetExhausted(RuntimeError):
    """The tenant's device-hour budget ran out while the evaluation ran (checked per batch)."""


def _store(evaluation_id: str, epoch: int, batch: list[dict[str, Any]], threshold: float) -> str:
    """One batch's samples, fenced on the run's epoch; the row's status (cancelling: stop)."""
    with session_scope() as session:
        status = rows.fence(session, evaluation_id, epoch)
        session.execute(
            insert(EvaluationSample),
            [
                {
                    "evaluation_id": evaluation_id, "index": s["index"], "epoch": epoch,
                    "record": s["record"], "sample": s["sample"], "prompt": s["prompt"],
                    "completion": s["completion"], "reward": s["reward"],
                    "scores": s["scores"], "errors": s["errors"], "length": s["length"],
                    "truncated": s["truncated"], "passed": s["reward"] >= threshold,
                }
                for s in batch
            ],
        )  # fmt: skip
    return status


def run(
    row: Evaluation, epoch: int, settings: Settings, work_dir: Path, beacon: Beacon | None = None
) -> dict[str, Any] | None:
    """The evaluation's results, or None when it was cancelled between two batches."""
    from workers.grpo.config import GenerationParams  # torch: worker processes only
    from workers.grpo.device import device_kind
    from workers.grpo.model_eval import evaluate_model

    spec, storage = row.spec, open_storage_from_settings(settings)
    with session_scope() as session:
        rows.start_over(session, row.id, epoch)
        rows.add_usage(session, row.id, device_kind=device_kind())
    records = resume.records(storage, spec["dataset"])[: spec["records"]]
    weights = weights_for(row.base_model, spec, storage, settings, work_dir)
    k, threshold = spec["samples_per_prompt"], spec["pass_threshold"]
    gen = GenerationParams.model_validate(spec["generation"])
    beacon = beacon or Beacon(None)
    samples: list[dict[str, Any]] = []
    with open_scorers(row.tenant_id, spec["verifiers"], beacon) as scorers:
        batches = evaluate_model(weights, records, scorers, k, gen, spec.get("seed", 0))
        for step, batch in enumerate(batches, start=1):
            numbered = [
                {**r, "index": len(samples) + i, "sample": r["index"]}
                for i, r in enumerate(batch.rows)
            ]
            samples += numbered
            status = _store(row.id, epoch, numbered, threshold)
            with session_scope() as session:
                rows.add_usage(session, row.id, tokens=batch.completion_tokens)
                spent = budget.budget_state(session, row.tenant_id)
            if spent is not None and spent.exhausted and status != "cancelling":
                total = len(records) * k
                raise BudgetExhausted(
                    f"device-hour budget exhausted ({spent.describe()}): stopped after "
                    f"{len(samples)} of {total} samples, which are kept"
                )
            beacon.send("step", step=step)  # a batch is the evaluation's step
            beacon.send("step_begins", step=step + 1)
            if status == "cancelling":
                return None
    return summarize(samples, k, threshold)


def main(argv: list[str]) -> int:
    """The run's life: DONE once its outcome is recorded (or the row is not its to run),
    LEFT_TO_RECONCILER when SIGTERM handed the row back."""
    if (entered := child.enter(argv)) is None:
        return LEFT_TO_RECONCILER
    evaluation_id, epoch = entered
    logging.basicConfig(level=logging.INFO, force=True)
    settings = get_settings()
    beacon = Beacon.from_env()
    with session_scope() as session:
        row = session.get(Evaluation, evaluation_id)
        if row is None or row.epoch != epoch or row.status not in rows.ACTIVE:
            return DONE  # taken over, or final: nothing of it is this run's
        if row.status == "cancelling":  # cancelled before it began
            rows.finish(session, evaluation_id, epoch, None)
            return DONE
        session.expunge(row)
    work_dir = settings.data_path / "work" / row.id
    try:
        results = run(row, epoch, settings, work_dir, beacon)
    except LeaseLost:
        log.warning("evaluation %s epoch %d lost its lease", row.id, epoch)
        return DONE
    except Exception as exc:  # every failure is the evaluation's outcome, with its reason
        log.exception("evaluation %s failed", row.id)
        with session_scope() as session:
            error = {"code": error_code(exc), "message": str(exc)[:2000]}
            rows.finish(session, row.id, epoch, None, error)
    else:
        with session_scope() as session:
            rows.finish(session, row.id, epoch, results)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return DONE


if __name__ == "__main__":
    # Out at once after the outcome (committed): no teardown of torch's modules.
    exit_now(main(sys.argv[1:]))
