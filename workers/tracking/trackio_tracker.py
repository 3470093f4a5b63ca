"""Trackio: local mode (its SQLite store under the tracker directory) or a Hugging Face Space
with the tenant's token. `trackio` reads its directory once, at import: set here first."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from workers.tracking.config import SAMPLE_COLUMNS, TrackingConfig, flatten, numeric, sample_table


class TrackioTracker:
    name = "trackio"

    def __init__(self, config: TrackingConfig) -> None:
        self.config = config
        self.run: Any = None

    def start(self, job_id: str, name: str, spec: dict[str, Any]) -> None:
        default = self.config.tracker_dir / "trackio"
        directory = Path(os.environ.setdefault("TRACKIO_DIR", str(default)))  # an operator's wins
        if self.config.trackio_token:  # this process runs one job: its tenant's token only
            os.environ["HF_TOKEN"] = self.config.trackio_token
        import trackio
        import trackio.utils

        if Path(trackio.utils.TRACKIO_DIR).resolve() != directory.resolve():
            raise RuntimeError(f"trackio already stores under {trackio.utils.TRACKIO_DIR}")
        directory.mkdir(parents=True, exist_ok=True)
        self.run = trackio.init(
            project=self.config.project, name=job_id, config=flatten(spec), resume="allow",
            space_id=self.config.trackio_space_id, embed=False, auto_log_gpu=False,
            auto_log_cpu=False,
        )  # fmt: skip

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log(numeric(metrics), step=step)

    def log_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        import trackio

        table = trackio.Table(columns=list(SAMPLE_COLUMNS), data=sample_table(rows))
        self.run.log({f"samples/{split}": table}, step=step)

    def flush(self) -> None:
        pass

    def finish(self, status: str) -> None:
        self.run.finish()
