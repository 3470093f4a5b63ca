"""The job's pinned verifier versions, opened as weighted scorers for the engine.

Their built-in kinds share one helper process (`workers.verifiers.builtin_host`), and every
batch is announced to the watchdog (`progress.py`), so a step that overruns inside a verifier
is told apart from one that overruns elsewhere (`verifier_timeout` vs `step_timeout`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from service.core.db import session_scope
from service.judges.endpoints import judge_context
from service.models import VerifierVersion
from service.settings import get_settings
from service.training.progress import Beacon
from service.verifiers.service import make_resolver
from workers.verifiers import BuiltinHost, JudgeContext, Verifier, open_verifier


@dataclass
class WeightedVerifier:
    """Adapts a verifier to the engine's Scorer protocol (name, weight, score)."""

    name: str
    weight: float
    verifier: Verifier
    beacon: Beacon = field(default_factory=lambda: Beacon(None))

    def score(self, samples: list[dict[str, Any]]) -> tuple[list[float | None], list[str | None]]:
        self.beacon.send("scoring", verifier=self.name)
        try:
            return self.verifier.score(samples)
        finally:
            self.beacon.send("scored", verifier=self.name)


@contextmanager
def open_scorers(
    tenant_id: str,
    pinned: list[dict[str, Any]],
    beacon: Beacon | None = None,
    judges: JudgeContext | None = None,
) -> Iterator[list[WeightedVerifier]]:
    """The pinned verifiers, opened; model judges call through `judges` (shared by a job's
    training and eval verifiers: one cache, one set of counters), else a context of their own."""
    if judges is None:
        judges = judge_context(get_settings(), tenant_id)
    with session_scope() as session, ExitStack() as stack:
        host = BuiltinHost()  # one helper process for every built-in leaf of these verifiers
        stack.callback(host.close)
        rows = []
        for ref in pinned:
            row = session.scalar(
                select(VerifierVersion).where(
                    VerifierVersion.tenant_id == tenant_id,
                    VerifierVersion.name == ref["name"],
                    VerifierVersion.version == ref["version"],
                )
            )
            if row is None:
                raise LookupError(f"verifier {ref['name']} version {ref['version']} is gone")
            rows.append((row, float(ref.get("weight", 1.0))))
        resolve = make_resolver(session, tenant_id)  # composite parts are pinned versions
        scorers = [
            WeightedVerifier(
                name=row.name,
                weight=weight,
                verifier=stack.enter_context(
                    open_verifier(
                        row.kind,
                        row.config,
                        name=row.name,
                        resolve=resolve,
                        host=host,
                        judges=judges,
                    )  # fmt: skip
                ),
                beacon=beacon or Beacon(None),
            )
            for row, weight in rows
        ]
        session.commit()
        yield scorers


def records_from_jsonl(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]
