"""What a job's trackers need to know: chosen by the job, connected by the operator."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# The columns of a sample table, in order (rows may carry more keys: they are dropped).
SAMPLE_COLUMNS = ("step", "group", "index", "prompt", "completion", "reward", "advantage")


@dataclass
class TrackingConfig:
    report_to: list[str]
    project: str = "grpo-service"
    mlflow_tracking_uri: str | None = None
    wandb_mode: Literal["online", "offline"] | None = None  # None: online with a key, else offline
    wandb_entity: str | None = None
    wandb_api_key: str | None = field(default=None, repr=False)
    trackio_space_id: str | None = None
    trackio_token: str | None = field(default=None, repr=False)
    tracker_dir: Path = Path(".grpo/trackers")  # W&B offline runs, Trackio's local store
    tensorboard_dir: Path = Path("tensorboard")  # this attempt's event files
    resume_step: int = 0  # the step this attempt resumes after (its checkpoint's)

    @property
    def secrets(self) -> list[str]:
        """Values that must never appear in a warning."""
        return [s for s in (self.wandb_api_key, self.trackio_token) if s]


def flatten(spec: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{"grpo": {"steps": 20}} -> {"grpo.steps": "20"}: nested objects by dotted keys, lists and
    scalars as JSON (the params of MLflow, the config of W&B and Trackio)."""
    flat: dict[str, str] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return flat


def sample_table(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Rows as lists in SAMPLE_COLUMNS order (a missing key is None)."""
    return [[row.get(c) for c in SAMPLE_COLUMNS] for row in rows]


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics a tracker can plot: numbers, not flags or text."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
