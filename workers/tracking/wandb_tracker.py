"""Weights & Biases: `wandb.init(id=<job id>, resume="allow")`, online with the tenant's API key
or offline (runs under the tracker directory, for `wandb sync`)."""

from __future__ import annotations

import os
from typing import Any, Literal

from workers.tracking.config import SAMPLE_COLUMNS, TrackingConfig, numeric, sample_table

_EXIT_CODES = {"succeeded": 0, "cancelled": 0}


class WandbTracker:
    name = "wandb"

    def __init__(self, config: TrackingConfig) -> None:
        self.config = config
        self.run: Any = None

    @property
    def mode(self) -> Literal["online", "offline"]:
        return self.config.wandb_mode or ("online" if self.config.wandb_api_key else "offline")

    def start(self, job_id: str, name: str, spec: dict[str, Any]) -> None:
        import wandb

        directory = self.config.tracker_dir / "wandb"
        directory.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(
            api_key=self.config.wandb_api_key,  # never written to a netrc file
            silent=True,
            console="off",
            x_disable_stats=True,
            # An explicit Settings object hides WANDB_INIT_TIMEOUT: read it here.
            init_timeout=float(os.environ.get("WANDB_INIT_TIMEOUT", "90")),
        )
        self.run = wandb.init(
            id=job_id, resume="allow", name=name, project=self.config.project,
            entity=self.config.wandb_entity, config=spec, dir=str(directory), mode=self.mode,
            settings=settings, reinit="create_new",
        )  # fmt: skip

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log(numeric(metrics), step=step)

    def log_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        import wandb

        table = wandb.Table(columns=list(SAMPLE_COLUMNS), data=sample_table(rows))
        self.run.log({f"samples/{split}": table}, step=step)

    def flush(self) -> None:
        pass

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=_EXIT_CODES.get(status, 1))
