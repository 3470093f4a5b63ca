"""Pre-flights on a worker (docs/preflight.md): a stored spec's data, weights and verifiers through
the engine's `workers.grpo.preflight` (one real GRPO step on a few prompts).

Two callers:
- the `grpo.preflight` task (`supervise`) runs a `POST /v1/jobs/preflight` row in a process of
  its own, `python -m service.training.preflight_run ID`, as a job trains in one: tenant code never
  runs in the Celery pool process, and a run past GRPO_PREFLIGHT_TIMEOUT_S is killed with every
  process below it (its verifier sandboxes);
- a job with `preflight: "require"` (`gate`), in its training process before its first step.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from service.core.db import session_scope
from service.jobs import preflight_rows
from service.models import Job, Preflight
from service.process_group import Child, die_with_parent, exit_now, kill_tree
from service.settings import Settings, get_settings
from service.storage import ObjectStorage, open_storage_from_settings
from service.training import forked, resume
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
    scorers: list[Scorer],
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
    scorers: list[Scorer],
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
def supervise(
    preflight_id: str, settings: Settings | None = None, command: list[str] | None = None
) -> None:
    """The task: claim the row, run it in a child process, fail it if the child overruns or
    dies without an outcome (`command` replaces the child's, for tests)."""
    settings = settings or get_settings()
    with session_scope() as session:
        row = preflight_rows.claim(session, preflight_id, settings)
    if row is None:
        log.info("pre-flight %s is not claimable (taken, final or expired)", preflight_id)
        return
    proc: Child
    if command is None:
        proc = forked.start(process_main, [preflight_id], env={})  # the engine loaded: `forked.py`
    else:
        proc = subprocess.Popen(command, process_group=0)
    try:
        rc = proc.wait(timeout=settings.preflight_timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        error = {
            "code": "preflight_timeout",
            "message": f"killed after {settings.preflight_timeout_s:g}s (GRPO_PREFLIGHT_TIMEOUT_S)",
        }
    except BaseException:
        _kill(proc)
        raise
    else:
        if rc == 0:
            return  # the child recorded the outcome
        error = {"code": "crashed", "message": f"the pre-flight process died (status {rc})"}
    with session_scope() as session:
        preflight_rows.finish(session, preflight_id, None, error)


def _kill(proc: Child) -> None:
    """SIGKILL the child's group and everything below it (sandboxes have sessions of their
    own), as the job watchdog's kill."""
    kill_tree(proc)


def run_row(
    row: Preflight, storage: ObjectStorage, settings: Settings, work_dir: Path
) -> dict[str, Any]:
    records = resume.records(storage, row.spec["dataset"])
    weights = weights_for(row.base_model, row.spec, storage, settings, work_dir)
    with open_scorers(row.tenant_id, row.spec["verifiers"]) as scorers:
        report = measure(row.spec, records, scorers, weights, settings)
    report["memory_estimate"] = row.memory_estimate
    return report


def main(argv: list[str]) -> int:
    die_with_parent(signal.SIGKILL)  # the task enforces the timeout: never outlive it
    logging.basicConfig(level=logging.INFO, force=True)
    settings = get_settings()
    with session_scope() as session:
        row = session.get(Preflight, argv[0])
        if row is None or row.status != "running":
            return 0
        session.expunge(row)
    work_dir = settings.data_path / "work" / row.id
    try:
        result = run_row(row, open_storage_from_settings(settings), settings, work_dir)
    except Exception as exc:  # every failure is the pre-flight's outcome, with its reason
        log.exception("pre-flight %s failed", row.id)
        with session_scope() as session:
            error = {"code": error_code(exc), "message": str(exc)[:2000]}
            preflight_rows.finish(session, row.id, None, error)
    else:
        with session_scope() as session:
            preflight_rows.finish(session, row.id, result)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0


def process_main(argv: list[str]) -> NoReturn:
    """The pre-flight's process: `main`, then out at once (the outcome is committed: no
    teardown of torch). `python -m service.training.preflight_run ID` runs it in a fresh one."""
    exit_now(main(argv))


if __name__ == "__main__":
    process_main(sys.argv[1:])
