"""Tenant secrets and trackers (docs/trackers.md): connection settings are the operator's."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr


class TrackerSettings(BaseModel):
    """The key that encrypts tenant secrets, and where MLflow, W&B and Trackio runs go; never a
    job's to choose."""

    secrets_key: SecretStr | None = Field(
        None,
        description="Fernet key(s) that encrypt tenant secrets, comma-separated (the first "
        "encrypts, all decrypt: rotation); unset in embedded mode: DATA_DIR/secrets.key.",
    )
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow tracking URI for report_to: mlflow (unset: refused)."
    )
    wandb_mode: Literal["online", "offline"] | None = Field(
        None, description="W&B mode; unset: online with a key (wandb_secret), else offline."
    )
    tracker_dir: Path | None = Field(
        None,
        description="Where workers keep W&B offline runs and Trackio's local store "
        "(unset: DATA_DIR/trackers).",
    )
