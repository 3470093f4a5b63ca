"""`grpo.evaluations`: sample a model on a dataset, score it, read pass@k (docs/evaluations.md)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from grpo_client.errors import ClientError
from grpo_client.models import FINAL_STATUSES, Page
from grpo_client.models_generated import EvaluationOut, EvaluationSampleOut
from grpo_client.transport import Transport


class EvaluationTimeout(ClientError):
    """`evaluations.wait` gave up before the evaluation finished."""


class Evaluations:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(
        self,
        body: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> EvaluationOut:
        """Queue an evaluation: `{model, dataset, verifiers, samples_per_prompt, generation,
        pass_threshold, max_records}` as a mapping or as keywords; the server's 422 names every
        bad field."""
        data = self._t.json(
            "POST", "/v1/evaluations", json=dict(body or {}) | fields, creates=True,
            idempotency_key=idempotency_key,
        )  # fmt: skip
        return EvaluationOut.model_validate(data)

    def get(self, evaluation_id: str) -> EvaluationOut:
        return EvaluationOut.model_validate(self._t.json("GET", f"/v1/evaluations/{evaluation_id}"))

    def list(self, *, limit: int = 20, after: str | None = None) -> Page[EvaluationOut]:
        """One page, newest first; iterating it walks every later page too."""
        params: dict[str, Any] = {"limit": limit, **({"after": after} if after else {})}
        page = Page[EvaluationOut].model_validate(
            self._t.json("GET", "/v1/evaluations", params=params)
        )
        return page.with_fetcher(lambda nxt: self.list(limit=limit, after=nxt))

    def cancel(self, evaluation_id: str) -> EvaluationOut:
        path = f"/v1/evaluations/{evaluation_id}/cancel"
        return EvaluationOut.model_validate(self._t.json("POST", path))

    def samples(
        self, evaluation_id: str, *, limit: int = 100, after: str | None = None
    ) -> Page[EvaluationSampleOut]:
        """Its samples record by record (each record's k consecutive); iterating the page
        walks every later one."""
        params: dict[str, Any] = {"limit": limit, **({"after": after} if after else {})}
        data = self._t.json("GET", f"/v1/evaluations/{evaluation_id}/samples", params=params)
        page = Page[EvaluationSampleOut].model_validate(data)
        return page.with_fetcher(lambda nxt: self.samples(evaluation_id, limit=limit, after=nxt))

    def wait(
        self, evaluation_id: str, *, timeout: float | None = None, poll_interval: float = 2.0
    ) -> EvaluationOut:
        """Poll until it is succeeded, failed or cancelled."""
        deadline = None if timeout is None else time.monotonic() + timeout
        evaluation = self.get(evaluation_id)
        while evaluation.status not in FINAL_STATUSES:
            if deadline is not None and time.monotonic() >= deadline:
                raise EvaluationTimeout(f"evaluation {evaluation_id} is still {evaluation.status}")
            time.sleep(poll_interval)
            evaluation = self.get(evaluation_id)
        return evaluation
