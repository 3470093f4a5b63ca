"""Python client of the grpo-service v1 API (httpx), and the `grpo` CLI built on it."""

from service.client.client import Client
from service.client.errors import ApiError, ChecksumMismatch, ClientError, ConnectionFailed
from service.client.jobs import WaitTimeout
from service.client.models import (
    CheckpointOut,
    DatasetOut,
    EventOut,
    JobCreate,
    JobOut,
    Page,
    VerifierOut,
    VerifierTestResult,
)
from service.client.rollouts import RolloutOut, RolloutPage

__all__ = [
    "ApiError",
    "CheckpointOut",
    "DatasetOut",
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
