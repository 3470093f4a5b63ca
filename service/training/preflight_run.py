"""Pre-flights on a worker (docs/preflight.md): a stored spec's data, weights and verifiers through
the engine's `workers.grpo.preflight` (one real GRPO step on a few prompts).

Two callers:
- a `POST /v1/jobs/preflight` row runs in a process of its own, `python -m
  service.training.preflight_run ID EPOCH SUPERVISOR_PID` (`main`), started by the run supervisor
  (`supervisor.py`, kind `kinds.PREFLIGHT`) that claimed the row under a lease in the Celery pool
  process: tenant code never runs there. The run beacons its one GRPO step (`progress.py`), so
  the supervisor kills it (with its verifier sandboxes) past the step budget, past
  GRPO_PREFLIGHT_TIMEOUT_S in all, or once its lease is lost; SIGTERM hands the row back;
- a job with `preflight: "require"` (`gate`), in its training process before its first step.
"""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.core.db import session_scope
from service.models import Job, Preflight
from service.preflight import rows as preflight_rows
from service.process_group import exit_now
from service.settings import Settings, get_settings
from service.storage import ObjectStorage, open_storage_from_settings
from service.training import child, resume
from service.training.child import DONE, LEFT_TO_RECONCILER
from service.training.progress import Beacon
from service.training.scorers import open_scorers
from service.training.uploads import error_code
from service.training.weights import weights_for

if TYPE_CHECKING:
    from workers.grpo.policy import BaseWeights
    from workers.grpo.scoring import Scorer

log = logging.getLogger(__name__)


class PreflightFailed(RuntimeError):
    """A job with `preflight: "require"` whose pre-flight raised a fatal warning."""


def measure(
    spec: dict[str, Any],
    records: list[dict[str, Any]],
    scorers: Sequence[Scorer],
    weights: BaseWeights,
    settings: Settings,
) -> dict[str, Any]:
    """The engine's pre-flight of a stored spec, as JSON."""
    from workers.grpo.config import TrainSpec  # torch: worker processes only
    from workers.grpo.preflight import preflight

    train_spec = TrainSpec.model_validate({k: spec[k] for k in TrainSpec.model_fields if k in spec})
    report = preflight(
        train_spec, records, scorers, weights=weights, prompts=settings.preflight_prompts
    )
    return report.as_dict()


def gate(
    job: Job,
    records: list[dict[str, Any]],
    scorers: Sequence[Scorer],
    weights: BaseWeights,
    settings: Settings,
    on_event: Callable[[str, str, dict[str, Any]], None],
) -> None:
    """`preflight: "require"`: before the job's first step, the pre-flight a POST would run, on
    the job's own scorers; its figures go in a `preflight` event, and a fatal warning fails the
    job (`preflight_failed`, the warnings in its error message). A job that has trained a step
    passed it on an earlier attempt."""
    if job.spec.get("preflight") != "require" or job.step > 0:
        return
    report = measure(job.spec, records, scorers, weights, settings)
    report["memory_estimate"] = job.memory_estimate
    fatal = [w for w in report["warnings"] if w["fatal"]]
    verdict = "; ".join(f"{w['code']}: {w['message']}" for w in fatal)
    summary = {**report, "samples": report["samples"][: report["group_size"]]}
    message = f"pre-flight failed: {verdict}" if fatal else "pre-flight passed"
    on_event("preflight", message, summary)
    if fatal:
        raise PreflightFailed(f"pre-flight: {verdict}")


# -- a POST /v1/jobs/preflight row ------------------------------------------------------------
def run_row(
    row: Preflight,
    storage: ObjectStorage,
    settings: Settings,
    work_dir: Path,
    beacon: Beacon | None = None,
) -> dict[str, Any]:
    beacon = beacon or Beacon(None)
    records = resume.records(storage, row.spec["dataset"])
    weights = weights_for(row.base_model, row.spec, storage, settings, work_dir)
    with open_scorers(row.tenant_id, row.spec["verifiers"], beacon) as scorers:
        beacon.send("step_begins", step=1)  # start-up over: its one step, under the step budget
        report = measure(row.spec, records, scorers, weights, settings)
        beacon.send("step", step=1)
    report["memory_estimate"] = row.memory_estimate
    return report


def main(argv: list[str]) -> int:
    """The run's life: DONE once its outcome is recorded (or the row is not its to run),
    LEFT_TO_RECONCILER when SIGTERM handed the row back."""
    if (entered := child.enter(argv)) is None:
        return LEFT_TO_RECONCILER
    preflight_id, epoch = entered
    logging.basicConfig(level=logging.INFO, force=True)
    settings = get_settings()
    beacon = Beacon.from_env()
    with session_scope() as session:
        row = session.get(Preflight, preflight_id)
        if row is None or row.epoch != epoch or row.status != "running":
            return DONE  # taken over, or final: nothing of it is this run's
        session.expunge(row)
    work_dir = settings.data_path / "work" / row.id
    try:
        result = run_row(row, open_storage_from_settings(settings), settings, work_dir, beacon)
    except Exception as exc:  # every failure is the pre-flight's outcome, with its reason
        log.exception("pre-flight %s failed", row.id)
        with session_scope() as session:
            error = {"code": error_code(exc), "message": str(exc)[:2000]}
            preflight_rows.finish(session, row.id, epoch, None, error)
    else:
        with session_scope() as session:
            preflight_rows.finish(session, row.id, epoch, result)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return DONE


if __name__ == "__main__":
    # Out at once after the outcome (committed): no teardown of torch's modules.
    exit_now(main(sys.argv[1:]))
