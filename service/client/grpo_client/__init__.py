"""Python client of the grpo-service v1 API (httpx), and the `grpo` CLI built on it."""

from grpo_client.client import Client
from grpo_client.errors import ApiError, ChecksumMismatch, ClientError, ConnectionFailed
from grpo_client.jobs import WaitTimeout
from grpo_client.models import (
    CheckpointOut,
    DatasetOut,
    DatasetRecordOut,
    EventOut,
    JobCreate,
    JobOut,
    Page,
    VerifierOut,
    VerifierTestResult,
)
from grpo_client.rollouts import RolloutOut, RolloutPage

__all__ = [
    "ApiError",
    "CheckpointOut",
    "DatasetOut",
    "DatasetRecordOut",
    "EventOut",
    "JobCreate",
    "JobOut",
    "Page",
    "RolloutOut",
    "RolloutPage",
    "VerifierOut",
    "VerifierTestResult",
    "ChecksumMismatch",
    "Client",
    "ClientError",
    "ConnectionFailed",
    "WaitTimeout",
]
