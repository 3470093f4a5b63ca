"""Submission checks of a job's trackers (`report_to`): each one named once, MLflow only where
the operator has a tracking server, and every secret the spec names one of the tenant's."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.core.problems import FieldError
from service.jobs.schemas import JobCreate
from service.secrets.service import find_secret
from service.settings import Settings


def check_trackers(
    session: Session, tenant_id: str, body: JobCreate, settings: Settings
) -> list[FieldError]:
    errors: list[FieldError] = []
    seen: set[str] = set()
    for i, tracker in enumerate(body.report_to):
        path = f"$.report_to[{i}]"
        if tracker in seen:
            errors.append(FieldError(path=path, message=f"{tracker} is named twice"))
        seen.add(tracker)
        if tracker == "mlflow" and not settings.mlflow_tracking_uri:
            message = "this service has no MLflow tracking server (GRPO_MLFLOW_TRACKING_URI)"
            errors.append(FieldError(path=path, message=message))
    for field in ("wandb_secret", "trackio_secret"):
        name = getattr(body, field)
        if name is not None and find_secret(session, tenant_id, name) is None:
            errors.append(FieldError(path=f"$.{field}", message=f"you have no secret '{name}'"))
    return errors
