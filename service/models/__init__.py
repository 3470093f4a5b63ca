"""ORM models, one file per table; importing this package registers them all on Base.metadata."""

from service.models.api_key import ApiKey
from service.models.base import Base
from service.models.checkpoint import Checkpoint
from service.models.dataset import Dataset
from service.models.idempotency_key import IdempotencyKey
from service.models.job import FINAL_STATUSES, LIVE_STATUSES, Job
from service.models.job_event import JobEvent
from service.models.job_metric import JobMetric
from service.models.tenant import Tenant
from service.models.verifier import VerifierVersion

__all__ = [
    "FINAL_STATUSES",
    "LIVE_STATUSES",
    "ApiKey",
    "Base",
    "Checkpoint",
    "Dataset",
    "IdempotencyKey",
    "Job",
    "JobEvent",
    "JobMetric",
    "Tenant",
    "VerifierVersion",
]
