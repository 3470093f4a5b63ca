"""Multi-turn environments from the client: `client.environments.create_python(name, source)`
(an existing name gets a new version), get, list, and `test`: scripted assistant turns replayed
through the training episode loop."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_client.models import Page
from grpo_client.models_generated import EnvironmentOut, EnvironmentTestResult, EpisodeOut
from grpo_client.transport import Transport

__all__ = ["EnvironmentOut", "EnvironmentTestResult", "Environments", "EpisodeOut"]

# A /test call may run for up to its budget in the sandbox (service.environments.service).
TEST_TIMEOUT_S = 120.0


class Environments:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create_python(
        self,
        name: str,
        source: str,
        description: str = "",
        *,
        timeout_s: float | None = None,
        idempotency_key: str | None = None,
    ) -> EnvironmentOut:
        """Register an environment from its source: `step(messages, record)`, optionally
        `reset(record)` and `tools = [...]`."""
        config: dict[str, Any] = {"source": source}
        if timeout_s is not None:
            config["timeout_s"] = timeout_s
        body = {"name": name, "kind": "python", "description": description, "config": config}
        data = self._t.json(
            "POST", "/v1/environments", json=body, creates=True, idempotency_key=idempotency_key
        )
        return EnvironmentOut.model_validate(data)

    def create_from_file(
        self, path: str | Path, name: str | None = None, description: str = "", **kw: Any
    ) -> EnvironmentOut:
        """Register a `.py` file; the name defaults to the file's stem."""
        path = Path(path)
        source = path.read_text(encoding="utf-8")
        return self.create_python(name or path.stem, source, description, **kw)

    def get(self, name: str, version: int | None = None) -> EnvironmentOut:
        path = f"/v1/environments/{name}" + (f"/versions/{version}" if version else "")
        return EnvironmentOut.model_validate(self._t.json("GET", path))

    def list(
        self, *, name: str | None = None, limit: int = 20, after: str | None = None
    ) -> Page[EnvironmentOut]:
        params = {k: v for k, v in {"name": name, "limit": limit, "after": after}.items() if v}
        data = self._t.json("GET", "/v1/environments", params=params)
        return (
            Page[EnvironmentOut]
            .model_validate(data)
            .with_fetcher(lambda nxt: self.list(name=name, limit=limit, after=nxt))
        )

    def test(
        self,
        name: str,
        samples: Iterable[Mapping[str, Any] | tuple[Mapping[str, Any], Sequence[str]]],
        *,
        version: int | None = None,
        max_turns: int | None = None,
    ) -> EnvironmentTestResult:
        """Replay samples `{record, turns}` (or `(record, turns)` pairs) through the episode
        loop training runs: per sample the transcript, per-turn rewards, their sum, errors."""
        body: dict[str, Any] = {"samples": [_sample(s) for s in samples]}
        if version is not None:
            body["version"] = version
        if max_turns is not None:
            body["max_turns"] = max_turns
        data = self._t.json(
            "POST", f"/v1/environments/{name}/test", json=body, timeout=TEST_TIMEOUT_S
        )
        return EnvironmentTestResult.model_validate(data)


def _sample(s: Mapping[str, Any] | tuple[Mapping[str, Any], Sequence[str]]) -> dict[str, Any]:
    if isinstance(s, tuple):
        record, turns = s
        return {"record": dict(record), "turns": list(turns)}
    return dict(s)
