"""The trackers of one claimed attempt at a job (worker side): the job's `report_to` options,
the operator's connections, the tenant's secrets (decrypted here, for this job only), and the
TensorBoard files uploaded with the job. Nothing here ever fails the job: a tracker's failure is
one `warning` event and that tracker is dropped (workers/tracking/fanout.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from service.core.db import session_scope
from service.models import Checkpoint, Job
from service.secrets.crypto import SecretsUnavailable
from service.secrets.service import reveal
from service.settings import Settings
from service.storage import ObjectStorage
from service.tensorboard.store import tensorboard_key, upload_tensorboard
from workers.tracking import Trackers, TrackingConfig, open_trackers

log = logging.getLogger(__name__)

EventSink = Callable[[str, str, dict[str, Any]], None]
_SECRET_FIELDS = {"wandb": "wandb_secret", "trackio": "trackio_secret"}


def warning_sink(on_event: EventSink) -> Callable[[str, str], None]:
    def warn(tracker: str, reason: str) -> None:
        message = f"tracker {tracker} disabled for this attempt: {reason}"
        on_event("warning", message, {"tracker": tracker, "reason": reason})

    return warn


def _secrets(
    job: Job, settings: Settings, report_to: list[str], warn: Callable[[str, str], None]
) -> tuple[list[str], dict[str, str]]:
    """The trackers still usable and the plaintext of the secrets they name."""
    values: dict[str, str] = {}
    usable = []
    with session_scope() as session:
        for tracker in report_to:
            name = job.spec.get(_SECRET_FIELDS.get(tracker, ""))
            if name:
                try:
                    value = reveal(session, settings, job.tenant_id, name)
                except SecretsUnavailable as exc:
                    warn(tracker, str(exc))
                    continue
                if value is None:
                    warn(tracker, f"secret '{name}' was deleted after the job was submitted")
                    continue
                values[tracker] = value
            usable.append(tracker)
    return usable, values


class JobTrackers:
    def __init__(
        self, fanout: Trackers, storage: ObjectStorage, key: str, tensorboard_dir: Path | None
    ) -> None:
        self.fanout, self.storage, self.key = fanout, storage, key
        self.tensorboard_dir = tensorboard_dir

    @classmethod
    def open(
        cls, job: Job, epoch: int, settings: Settings, storage: ObjectStorage, work_dir: Path,
        on_event: EventSink,
    ) -> JobTrackers:  # fmt: skip
        """Build and start the job's trackers (none when `report_to` is empty)."""
        warn = warning_sink(on_event)
        report_to: list[str] = list(dict.fromkeys(job.spec.get("report_to") or []))
        values: dict[str, str] = {}
        resume_step = 0
        if report_to:
            report_to, values = _secrets(job, settings, report_to, warn)
            with session_scope() as session:
                resume_step = session.scalar(
                    select(func.max(Checkpoint.step)).where(Checkpoint.job_id == job.id)
                ) or 0  # fmt: skip
        config = TrackingConfig(
            report_to=report_to,
            project=job.spec.get("tracker_project") or "grpo-service",
            mlflow_tracking_uri=settings.mlflow_tracking_uri,
            wandb_mode=settings.wandb_mode,
            wandb_entity=job.spec.get("wandb_entity"),
            wandb_api_key=values.get("wandb"),
            trackio_space_id=job.spec.get("trackio_space_id"),
            trackio_token=values.get("trackio"),
            tracker_dir=settings.tracker_path,
            tensorboard_dir=work_dir / "tensorboard",
            resume_step=resume_step,
        )
        fanout = open_trackers(config, warn)
        fanout.start(job.id, job.spec.get("name") or job.id, job.spec)
        tb_dir = config.tensorboard_dir if "tensorboard" in report_to else None
        return cls(fanout, storage, tensorboard_key(job.tenant_id, job.id, epoch), tb_dir)

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        self.fanout.log_metrics(step, metrics)

    def log_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        self.fanout.log_samples(step, split, rows)

    def checkpointed(self) -> None:
        """A checkpoint is stored: so are the event files up to it."""
        self.fanout.flush()
        self._upload()

    def close(self, job_id: str) -> None:
        """End the trackers' runs with the job's status (a released job's runs stay open)."""
        try:
            with session_scope() as session:
                status = session.scalar(select(Job.status).where(Job.id == job_id)) or "unknown"
            self.fanout.finish(status)
        except Exception:  # the outcome is recorded already; a tracker's end is not the job's
            log.warning("job %s: the trackers did not finish cleanly", job_id, exc_info=True)
        self._upload()

    def _upload(self) -> None:
        if self.tensorboard_dir is None or not self.tensorboard_dir.is_dir():
            return
        try:
            upload_tensorboard(self.storage, self.key, self.tensorboard_dir)
        except Exception:  # the next checkpoint (or the end) uploads them again
            log.warning("could not upload the TensorBoard files to %s", self.key, exc_info=True)
