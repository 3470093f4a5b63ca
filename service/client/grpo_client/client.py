"""`Client(base_url, api_key)`: the whole v1 API from Python.

from grpo_client import Client

with Client("http://127.0.0.1:8000", "grpo_...") as grpo:
    grpo.verifiers.create_python("digits", source)
    ds = grpo.datasets.upload("digits.jsonl")
    job = grpo.jobs.create({"base_model": "...", "dataset": ds.id,
                            "verifiers": [{"name": "digits"}]})
    job = grpo.jobs.wait(job.id, on_event=print)
    path = grpo.checkpoints.download(job.id, "latest", "out/")
"""

from __future__ import annotations

from typing import Any

import httpx

from grpo_client.catalog import Models
from grpo_client.checkpoints import Checkpoints
from grpo_client.config import resolve
from grpo_client.environments import Environments
from grpo_client.evaluations import Evaluations
from grpo_client.jobs import Jobs
from grpo_client.resources import Datasets, Verifiers
from grpo_client.transport import Transport
from grpo_client.usage import Usage
from grpo_client.webhooks import Webhooks


class Client:
    """The whole v1 API. `Client()` finds the server and key as the `grpo` CLI does: the
    arguments, else GRPO_URL / GRPO_API_KEY, else the profile `grpo login` saved."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        http: httpx.Client | None = None,
    ) -> None:
        profile = resolve(base_url, api_key)
        self.transport = Transport(
            profile.url,
            profile.api_key,
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            http=http,
        )
        self.verifiers = Verifiers(self.transport)
        self.environments = Environments(self.transport)
        self.datasets = Datasets(self.transport)
        self.jobs = Jobs(self.transport)
        self.checkpoints = Checkpoints(self.transport)
        self.models = Models(self.transport)
        self.webhooks = Webhooks(self.transport)
        self.usage = Usage(self.transport)
        self.evaluations = Evaluations(self.transport)

    @property
    def base_url(self) -> str:
        return self.transport.base_url

    def me(self) -> dict[str, Any]:
        """`GET /v1/me`: the tenant this key belongs to, and the key's prefix and dates."""
        return self.transport.json("GET", "/v1/me")

    def health(self) -> dict[str, Any]:
        """`GET /readyz`: whether database, broker and storage are reachable."""
        response = self.transport.http.get("/readyz")
        return response.json()

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
