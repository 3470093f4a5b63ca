"""Evaluations on a worker (docs/evaluations.md), run as a job is:

- the `grpo.evaluation` task (`supervise`, in the Celery pool process) claims the row under a
  lease, starts the run in a process of its own (`process_main`, forked with the engine loaded:
  `forked.py`; tenant code never runs in the pool process), renews the lease while that process
  lives, and kills it (with its verifier sandboxes) when a cancel is asked for or the lease is
  lost, or when it stores no batch within its queue's step budget; the outcome's transition
  meters the device time from the claim;
- the run (`main`) loads the weights as a job would (`weights_for`: catalog model, checkpoint or
  adapter chain), samples and scores through the engine (`workers.grpo.model_eval`) with the
  pinned verifiers (`open_scorers`, the sandbox included), stores each batch's samples fenced
  on its epoch, stops at a batch boundary once cancelled, and writes the results.

A claim that expires (the worker died) is taken back by the reconciler, and the next claim
starts over: its first write drops the samples of earlier epochs.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from sqlalchemy import insert, select

from service.core.db import session_scope
from service.core.leases import LeaseLost
from service.evaluations import rows
from service.evaluations.results import summarize
from service.models import Evaluation, EvaluationSample
from service.process_group import die_with_parent, exit_now, kill_tree
from service.settings import Settings, get_settings
from service.storage import open_storage_from_settings
from service.training import forked, resume
from service.training.scorers import open_scorers
from service.training.uploads import error_code
from service.training.weights import weights_for

log = logging.getLogger(__name__)
POLL_S = 0.5  # how often the pool process looks at its run (the lease renews less often)


def supervise(evaluation_id: str, settings: Settings | None = None) -> None:
    settings = settings or get_settings()
    with session_scope() as session:
        epoch = rows.claim(session, evaluation_id, settings.lease_seconds)
        queue = session.scalar(select(Evaluation.queue).where(Evaluation.id == evaluation_id))
    if epoch is None or queue is None:
        log.info("evaluation %s is not claimable (taken or final)", evaluation_id)
        return
    proc = forked.start(process_main, [evaluation_id, str(epoch)], env={})  # the engine loaded
    stall = Stall(settings.step_timeout_for(queue), settings.startup_timeout_s)
    try:
        error = _watch(proc, evaluation_id, epoch, settings, stall)
    except BaseException:
        kill_tree(proc)
        raise
    if error is not None:
        with session_scope() as session:
            rows.finish(session, evaluation_id, epoch, None, error)


@dataclass
class Stall:
    """A run that stores no new batch within its queue's step budget (before its first batch,
    that plus GRPO_STARTUP_TIMEOUT_S: the model loads) is stuck: its worker kills it, as a
    job's watchdog kills a step that overruns."""

    step_s: float
    startup_s: float
    seen: int = 0  # samples stored when last looked
    since: float = field(default_factory=time.monotonic)

    def overdue(self, stored: int, now: float) -> bool:
        if stored != self.seen:
            self.seen, self.since = stored, now
        budget = self.step_s + (self.startup_s if self.seen == 0 else 0.0)
        return now - self.since > budget


def _watch(
    proc: forked.ForkedProcess,
    evaluation_id: str,
    epoch: int,
    settings: Settings,
    stall: Stall,
) -> dict[str, str] | None:
    """Wait for the run, renewing its lease; the error to record if it left no outcome (None:
    the lease was lost, the row is another claim's)."""
    renew_every = min(settings.heartbeat_seconds, 2.0)
    renewed = time.monotonic()
    while True:
        try:
            rc = proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            if time.monotonic() - renewed < renew_every:
                continue
            renewed = time.monotonic()
            try:
                with session_scope() as session:
                    status = rows.renew(session, evaluation_id, epoch, settings.lease_seconds)
                    stored = rows.stored(session, evaluation_id, epoch)
            except LeaseLost:
                if proc.poll() is not None:
                    continue  # it has just recorded its outcome (the lease went with it)
                log.warning("evaluation %s: lease lost, stopping its run", evaluation_id)
                kill_tree(proc)
                return None
            if status == "cancelling":
                kill_tree(proc)
                return {"code": "cancelled", "message": "cancelled"}  # finish: `cancelled`
            if stall.overdue(stored, time.monotonic()):
                kill_tree(proc)
                message = f"no batch stored within {stall.step_s + stall.startup_s:g}s"
                if stall.seen:
                    message = f"no batch stored within {stall.step_s:g}s (the step budget)"
                return {"code": "step_timeout", "message": message}
            continue
        # A run that recorded its outcome left nothing to finish (`finish` then does nothing);
        # one that found its row cancelled before it began recorded none: finish it here.
        if rc == 0:
            return {"code": "crashed", "message": "the evaluation process ended without an outcome"}
        return {"code": "crashed", "message": f"the evaluation process died (status {rc})"}


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


def run(row: Evaluation, epoch: int, settings: Settings, work_dir: Path) -> dict[str, Any] | None:
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
    samples: list[dict[str, Any]] = []
    with open_scorers(row.tenant_id, spec["verifiers"]) as scorers:
        batches = evaluate_model(weights, records, scorers, k, gen, spec.get("seed", 0))
        for batch in batches:
            numbered = [
                {**r, "index": len(samples) + i, "sample": r["index"]}
                for i, r in enumerate(batch.rows)
            ]
            samples += numbered
            status = _store(row.id, epoch, numbered, threshold)
            with session_scope() as session:
                rows.add_usage(session, row.id, tokens=batch.completion_tokens)
            if status == "cancelling":
                return None
    return summarize(samples, k, threshold)


def main(argv: list[str]) -> int:
    die_with_parent(signal.SIGKILL)  # the pool process holds the lease: never outlive it
    logging.basicConfig(level=logging.INFO, force=True)
    settings = get_settings()
    evaluation_id, epoch = argv[0], int(argv[1])
    with session_scope() as session:
        row = session.get(Evaluation, evaluation_id)
        if row is None or row.epoch != epoch or row.status != "running":
            return 0
        session.expunge(row)
    work_dir = settings.data_path / "work" / row.id
    try:
        results = run(row, epoch, settings, work_dir)
    except LeaseLost:
        log.warning("evaluation %s epoch %d lost its lease", row.id, epoch)
        return 0
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
    return 0


def process_main(argv: list[str]) -> NoReturn:
    """The run's process: `main`, then out at once (the outcome is committed: no teardown of
    torch). `python -m service.training.evaluation_run ID EPOCH` runs it in a fresh one."""
    exit_now(main(argv))


if __name__ == "__main__":
    process_main(sys.argv[1:])
