"""ORM models, one file per table; importing this package registers them all on Base.metadata."""

from service.models.api_key import ApiKey
from service.models.base import Base
from service.models.catalog_model import CatalogModel
from service.models.checkpoint import Checkpoint
from service.models.dataset import Dataset
from service.models.device_turn import DeviceTurn
from service.models.environment import EnvironmentVersion
from service.models.evaluation import EVALUATION_FINAL, Evaluation, EvaluationSample
from service.models.idempotency_key import IdempotencyKey
from service.models.job import FINAL_STATUSES, LIVE_STATUSES, UNFINISHED_STATUSES, Job
from service.models.job_event import JobEvent
from service.models.job_metric import JobMetric
from service.models.job_usage import JobUsage
from service.models.preflight import PREFLIGHT_FINAL, Preflight
from service.models.rollout_file import RolloutFile
from service.models.tenant import Tenant
from service.models.tenant_secret import TenantSecret
from service.models.tinker_checkpoint import TinkerCheckpoint
from service.models.tinker_request import TinkerRequest
from service.models.tinker_run import TinkerRun
from service.models.tinker_session import TinkerSession
from service.models.verifier import VerifierVersion
from service.models.versioned import NamedVersion
from service.models.webhook import Webhook
from service.models.webhook_delivery import WebhookDelivery
from service.models.worker_heartbeat import WorkerHeartbeat

__all__ = [
    "EVALUATION_FINAL",
    "FINAL_STATUSES",
    "LIVE_STATUSES",
    "PREFLIGHT_FINAL",
    "UNFINISHED_STATUSES",
    "ApiKey",
    "Base",
    "CatalogModel",
    "Checkpoint",
    "Dataset",
    "DeviceTurn",
    "EnvironmentVersion",
    "Evaluation",
    "EvaluationSample",
    "IdempotencyKey",
    "Job",
    "JobEvent",
    "JobMetric",
    "JobUsage",
    "NamedVersion",
    "Preflight",
    "RolloutFile",
    "Tenant",
    "TenantSecret",
    "TinkerCheckpoint",
    "TinkerRequest",
    "TinkerRun",
    "TinkerSession",
    "VerifierVersion",
    "Webhook",
    "WebhookDelivery",
    "WorkerHeartbeat",
]
