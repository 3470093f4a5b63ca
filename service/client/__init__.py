"""Python client of the grpo-service v1 API (httpx), and the `grpo` CLI built on it."""

from service.client.client import Client
from service.client.errors import ApiError, ChecksumMismatch, ClientError, ConnectionFailed
from service.client.jobs import WaitTimeout

__all__ = [
    "ApiError",
    "ChecksumMismatch",
    "Client",
    "ClientError",
    "ConnectionFailed",
    "WaitTimeout",
]
