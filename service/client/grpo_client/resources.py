"""Verifiers and datasets: register, test, upload, read."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from grpo_client.errors import ApiError
from grpo_client.models import (
    DatasetOut,
    DatasetRecordOut,
    Page,
    VerifierOut,
    VerifierTestResult,
)
from grpo_client.transport import Transport


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class Verifiers:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(
        self,
        name: str,
        kind: str,
        config: Mapping[str, Any],
        description: str = "",
        *,
        idempotency_key: str | None = None,
    ) -> VerifierOut:
        """Register a verifier; an existing name gets a new version."""
        body = {"name": name, "kind": kind, "description": description, "config": dict(config)}
        data = self._t.json(
            "POST", "/v1/verifiers", json=body, creates=True, idempotency_key=idempotency_key
        )
        return VerifierOut.model_validate(data)

    def create_python(
        self,
        name: str,
        source: str,
        description: str = "",
        *,
        idempotency_key: str | None = None,
    ) -> VerifierOut:
        """Register a python verifier from its source text."""
        return self.create(
            name, "python", {"source": source}, description, idempotency_key=idempotency_key
        )

    def get(self, name: str, version: int | None = None) -> VerifierOut:
        path = f"/v1/verifiers/{name}" + (f"/versions/{version}" if version else "")
        return VerifierOut.model_validate(self._t.json("GET", path))

    def list(
        self, *, name: str | None = None, limit: int = 20, after: str | None = None
    ) -> Page[VerifierOut]:
        params = _params(name=name, limit=limit, after=after)
        return Page[VerifierOut].model_validate(self._t.json("GET", "/v1/verifiers", params=params))

    def test(
        self, name: str, samples: Iterable[Mapping[str, Any]], version: int | None = None
    ) -> VerifierTestResult:
        """Score samples `{prompt, completion, ...fields}` exactly as training would."""
        body = {"samples": [dict(s) for s in samples], **_params(version=version)}
        data = self._t.json("POST", f"/v1/verifiers/{name}/test", json=body)
        return VerifierTestResult.model_validate(data)


class Datasets:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def upload(self, path: str | Path, name: str | None = None) -> DatasetOut:
        """Upload a JSONL file (multipart); the name defaults to the file's stem."""
        path = Path(path)
        content = path.read_bytes()
        data = self._t.json(
            "POST",
            "/v1/datasets",
            data={"name": name or path.stem},
            files={"file": (path.name, content, "application/jsonl")},
            creates=True,
        )
        return DatasetOut.model_validate(data)

    def create(self, name: str, records: Iterable[Mapping[str, Any]]) -> DatasetOut:
        """Create a dataset from in-memory records (JSON body)."""
        body = {"name": name, "records": [dict(r) for r in records]}
        return DatasetOut.model_validate(
            self._t.json("POST", "/v1/datasets", json=body, creates=True)
        )

    def get(self, dataset_id: str) -> DatasetOut:
        return DatasetOut.model_validate(self._t.json("GET", f"/v1/datasets/{dataset_id}"))

    def list(self, *, limit: int = 20, after: str | None = None) -> Page[DatasetOut]:
        """One page of datasets, newest first; iterating it walks every later page too."""
        params = _params(limit=limit, after=after)
        data = self._t.json("GET", "/v1/datasets", params=params)
        page = Page[DatasetOut].model_validate(data)
        return page.with_fetcher(lambda nxt: self.list(limit=limit, after=nxt))

    def find(self, reference: str) -> DatasetOut:
        """The dataset `reference` names, as a job spec's `dataset` does: its id (`ds_…`), or
        its name when exactly one of yours has it (else ApiError 404, or 409 naming them)."""
        if reference.startswith("ds_"):
            return self.get(reference)
        named = [d for d in self.list(limit=100) if d.name == reference]
        if len(named) == 1:
            return named[0]
        if not named:
            raise ApiError.local(404, "Not Found", f"no dataset '{reference}'")
        ids = ", ".join(d.id for d in named)
        detail = f"{len(named)} datasets are named '{reference}' ({ids}): use an id"
        raise ApiError.local(409, "Conflict", detail)

    def delete(self, dataset_id: str) -> None:
        self._t.request("DELETE", f"/v1/datasets/{dataset_id}")

    def download(self, dataset_id: str, path: str | Path) -> Path:
        """The dataset's records as stored (JSONL) written to `path`; returns it."""
        response = self._t.request("GET", f"/v1/datasets/{dataset_id}/download")
        path = Path(path)
        path.write_bytes(response.content)
        return path

    def from_rollouts(
        self,
        job_id: str,
        format: str,
        *,
        split: str | None = None,
        steps: Iterable[int] | None = None,
        min_reward: float | None = None,
        name: str | None = None,
    ) -> DatasetOut:
        """A dataset of a job's stored rollouts: format `sft` ({prompt, completion, reward} per
        completion) or `dpo` ({prompt, chosen, rejected}: best and worst of each group whose
        rewards differ)."""
        body = {"job_id": job_id, "format": format, **_params(
            split=split, steps=None if steps is None else list(steps), min_reward=min_reward,
            name=name,
        )}  # fmt: skip
        return DatasetOut.model_validate(
            self._t.json("POST", "/v1/datasets/from-rollouts", json=body, creates=True)
        )

    def records(
        self, dataset_id: str, *, limit: int = 100, after: str | None = None
    ) -> Page[DatasetRecordOut]:
        """The dataset's records in file order, one page; iterating it walks every later page."""
        params = _params(limit=limit, after=after)
        data = self._t.json("GET", f"/v1/datasets/{dataset_id}/records", params=params)
        page = Page[DatasetRecordOut].model_validate(data)
        return page.with_fetcher(lambda nxt: self.records(dataset_id, limit=limit, after=nxt))


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of a JSONL file; a bad line raises ValueError naming its number."""
    with Path(path).open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {number}: invalid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}: line {number}: expected a JSON object")
            yield record
