"""MLflow: one run per job, found again by its `grpo.job_id` tag, so a later attempt of the job
continues the same run; the steps it already holds are not logged twice (a redone step after a
resume keeps the values the first attempt logged)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from workers.tracking.config import SAMPLE_COLUMNS, TrackingConfig, flatten, numeric

JOB_TAG = "grpo.job_id"
_FINAL = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
BATCH = 100  # MLflow's limit of params per log_batch


def _artifact_location(uri: str) -> str | None:
    """A local store (sqlite:///path) keeps artifacts beside its database, not in the worker's
    working directory; a server decides for itself (None)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None


class MlflowTracker:
    name = "mlflow"

    def __init__(self, config: TrackingConfig) -> None:
        self.config = config
        self.run_id = ""  # `start` opens or finds it
        self.held_through = 0  # the highest step the run held when this attempt began

    def start(self, job_id: str, name: str, spec: dict[str, Any]) -> None:
        uri = self.config.mlflow_tracking_uri
        if not uri:
            raise RuntimeError("GRPO_MLFLOW_TRACKING_URI is not set")
        # An unreachable server fails in seconds, not after MLflow's minutes of retries.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(self.config.project)
        if experiment is None:
            exp_id = client.create_experiment(self.config.project, _artifact_location(uri))
        else:
            exp_id = experiment.experiment_id
        found = client.search_runs([exp_id], filter_string=f"tags.`{JOB_TAG}` = '{job_id}'")
        if found:  # a later attempt: the same run, RUNNING again
            run = found[0]
            self.run_id = run.info.run_id
            client.update_run(self.run_id, status="RUNNING")
            self.held_through = max(
                (m.step for key in run.data.metrics for m in client.get_metric_history(
                    self.run_id, key)), default=0,
            )  # fmt: skip
            return
        run = client.create_run(exp_id, run_name=name, tags={JOB_TAG: job_id})
        self.run_id = run.info.run_id
        params = [Param(k, v[:6000]) for k, v in flatten(spec).items()]
        for i in range(0, len(params), BATCH):
            client.log_batch(self.run_id, params=params[i : i + BATCH])

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        if step <= self.held_through:
            return  # logged by an earlier attempt
        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in numeric(metrics).items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        if step <= self.held_through:
            return  # an earlier attempt logged this step's samples
        columns = {c: [row.get(c) for row in rows] for c in SAMPLE_COLUMNS}
        # One table per split: MLflow appends the rows of each call to the same artifact.
        self.client.log_table(self.run_id, data=columns, artifact_file=f"samples/{split}.json")

    def flush(self) -> None:
        pass  # every call above is synchronous

    def finish(self, status: str) -> None:
        if status in _FINAL:  # released or lost: the job goes on, so does its run
            self.client.set_terminated(self.run_id, _FINAL[status])
