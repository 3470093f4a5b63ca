"""One object fanning a job's curves out to the trackers it chose (TRL's `report_to`).

A tracker that fails (bad credentials, an unreachable server, a missing package) never fails
the job: its first failure becomes ONE warning (tracker and reason, secrets blanked out) and the
tracker is dropped for the rest of the attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from workers.tracking.config import TrackingConfig

log = logging.getLogger(__name__)

Warn = Callable[[str, str], None]  # (tracker, reason)


class Tracker(Protocol):
    name: str

    def start(self, job_id: str, name: str, spec: dict[str, Any]) -> None: ...
    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None: ...
    def log_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None: ...
    def flush(self) -> None: ...
    def finish(self, status: str) -> None: ...


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


class Trackers:
    def __init__(self, trackers: list[Tracker], warn: Warn, secrets: list[str]) -> None:
        self.active = list(trackers)
        self._warn, self._secrets = warn, secrets

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.active]

    def _each(self, method: str, *args: Any) -> None:
        for tracker in list(self.active):
            try:
                getattr(tracker, method)(*args)
            except Exception as exc:  # an ImportError too: never the job's failure
                self.active.remove(tracker)
                reason = redact(f"{type(exc).__name__}: {exc}", self._secrets)[:500]
                log.warning("tracker %s dropped (%s): %s", tracker.name, method, reason)
                self._warn(tracker.name, reason)

    def start(self, job_id: str, name: str, spec: dict[str, Any]) -> None:
        self._each("start", job_id, name, spec)

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        self._each("log_metrics", step, metrics)

    def log_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._each("log_samples", step, split, rows)

    def flush(self) -> None:
        self._each("flush")

    def finish(self, status: str) -> None:
        self._each("finish", status)
        self.active = []


def open_trackers(config: TrackingConfig, warn: Warn) -> Trackers:
    """The trackers `config.report_to` names (none imported yet: each imports at `start`)."""
    from workers.tracking.mlflow_tracker import MlflowTracker
    from workers.tracking.tensorboard_tracker import TensorboardTracker
    from workers.tracking.trackio_tracker import TrackioTracker
    from workers.tracking.wandb_tracker import WandbTracker

    kinds: dict[str, Callable[[TrackingConfig], Tracker]] = {
        "mlflow": MlflowTracker,
        "wandb": WandbTracker,
        "tensorboard": TensorboardTracker,
        "trackio": TrackioTracker,
    }
    return Trackers([kinds[n](config) for n in config.report_to], warn, config.secrets)
