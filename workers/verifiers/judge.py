"""Model judges at run time: `score_model`/`label_model` graders and `judge` verifiers as
Verifiers that call a chat model over HTTP.

A judge runs in the process that opened it (the training worker; the API's threadpool for
`/test` and graders/run), never in the python sandbox, which has no network. Where it sends
its calls is not in its config: the opener's `JudgeContext` maps a judge to a `JudgeEndpoint`
(the operator's, or one a tenant secret holds), built by the service, which this package never
imports. The context is shared by every judge of one job: it caches answers per (judge, input)
for the job, and counts calls, cache hits, seconds and errors per judge
(`judge/<name>/calls|cache_hits|seconds|errors`, taken per step by `take_metrics`).

One batch: each item's messages rendered (`grader_templates.py`), identical inputs sent once,
cached ones not sent, the rest sent `concurrency` at a time under one deadline for the batch;
an answer that holds no score or label, a transport failure or the deadline is that item's
error (score None: 0 and counted by the engine, as every verifier error is).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

import httpx

from .base import BaseVerifier, Sample, ScoreResult
from .grader_scoring import namespaces
from .grader_templates import MissingField, Template, parse_template, render
from .judge_answers import JudgeAnswerError, parse_label, parse_score
from .judge_config import JudgeConfig, LabelModelGrader, ModelGrader, ScoreModelGrader

MAX_CACHED = 50_000
# A score_model/label_model grader's answer cap unless its sampling_params say otherwise
# (label_model has none): a score or a label comes first in a judge's answer.
GRADER_MAX_TOKENS = 32
_ERROR_CHARS = 500


class JudgeUnavailableError(RuntimeError):
    """No endpoint for this judge (none configured, or its tenant secret is unusable)."""


@dataclass(frozen=True)
class JudgeEndpoint:
    """Where a judge's chat completions go: a full `.../chat/completions` URL and its token."""

    chat_url: str
    token: str | None = None
    timeout_s: float = 120.0
    # A tenant's endpoint: `chat_url` holds the checked address, these the name (Host, SNI).
    headers: dict[str, str] = field(default_factory=dict)
    extensions: dict[str, Any] = field(default_factory=dict)


# secret name (None: the operator's endpoint) -> the endpoint; raises JudgeUnavailableError
EndpointFor = Callable[[str | None], JudgeEndpoint]


@dataclass
class _Counts:
    calls: int = 0
    cache_hits: int = 0
    seconds: float = 0.0
    errors: int = 0


@dataclass
class JudgeContext:
    """What the judges of one job (or one `/test` call) share: endpoints, cache, counters."""

    endpoint_for: EndpointFor
    concurrency: int = 4
    deadline_s: float = 600.0
    max_cached: int = MAX_CACHED
    _endpoints: dict[str | None, JudgeEndpoint] = field(default_factory=dict)
    _cache: OrderedDict[str, tuple[float | None, str | None]] = field(default_factory=OrderedDict)
    _counts: dict[str, _Counts] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def endpoint(self, secret: str | None) -> JudgeEndpoint:
        with self._lock:
            if secret not in self._endpoints:
                self._endpoints[secret] = self.endpoint_for(secret)
            return self._endpoints[secret]

    def cached(self, key: str) -> tuple[float | None, str | None] | None:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            return hit

    def remember(self, key: str, outcome: tuple[float | None, str | None]) -> None:
        with self._lock:
            self._cache[key] = outcome
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)

    def count(self, name: str, **deltas: float) -> None:
        with self._lock:
            counts = self._counts.setdefault(name, _Counts())
            for key, value in deltas.items():
                setattr(counts, key, getattr(counts, key) + value)

    def take_metrics(self) -> dict[str, float]:
        """Every judge's counts since the last take, as `judge/<name>/<count>` metrics."""
        with self._lock:
            counts, self._counts = self._counts, {}
        return {
            f"judge/{name}/{key}": float(value)
            for name, c in counts.items()
            for key, value in vars(c).items()
        }


@dataclass(frozen=True)
class JudgeSpec:
    """One judge, whatever its config shape: what it sends and how it reads the answer."""

    model: str
    messages: tuple[tuple[str, Template], ...]
    sampling: dict[str, Any]
    read: Callable[[str], float]
    identity: str  # the config as canonical JSON: part of every cache key
    endpoint_secret: str | None = None


def judge_spec(config: JudgeConfig | ModelGrader) -> JudgeSpec:
    identity = json.dumps(config.model_dump(mode="json"), sort_keys=True)
    if isinstance(config, JudgeConfig):
        messages = [("user", config.prompt_template)]
        if config.system is not None:
            messages.insert(0, ("system", config.system))
        sampling = {"max_tokens": config.max_tokens, "temperature": config.temperature}
        lo, hi = config.range
        labels, passing = config.labels or [], set(config.passing_labels or [])
        by_label = config.parse == "label"
        secret = config.endpoint_secret
    else:
        messages = [(m.role, m.template()) for m in config.input]
        params = getattr(config, "sampling_params", None)  # label_model has none
        sampling = {"max_tokens": GRADER_MAX_TOKENS, "temperature": 0.0}
        if params is not None:
            given = {
                "max_tokens": params.max_completions_tokens, "temperature": params.temperature,
                "top_p": params.top_p, "seed": params.seed,
            }  # fmt: skip
            sampling |= {k: v for k, v in given.items() if v is not None}
        lo, hi = config.range if isinstance(config, ScoreModelGrader) else (0.0, 1.0)
        by_label = isinstance(config, LabelModelGrader)
        labels = config.labels if isinstance(config, LabelModelGrader) else []
        passing = set(config.passing_labels) if isinstance(config, LabelModelGrader) else set()
        secret = None

    def read(answer: str) -> float:
        if by_label:
            return 1.0 if parse_label(answer, labels) in passing else 0.0
        return parse_score(answer, lo, hi)

    parsed = tuple((role, parse_template(text)) for role, text in messages)
    return JudgeSpec(config.model, parsed, sampling, read, identity, secret)


class JudgeVerifier(BaseVerifier):
    """A model judge as a Verifier (see the module docstring)."""

    def __init__(self, name: str, spec: JudgeSpec, context: JudgeContext) -> None:
        super().__init__(name)
        self.spec, self.context = spec, context
        self._client: httpx.Client | None = None
        self._pool: ThreadPoolExecutor | None = None

    def _render(self, sample: Sample) -> list[dict[str, str]]:
        item, namespace = namespaces(sample)
        return [{"role": r, "content": render(t, item, namespace)} for r, t in self.spec.messages]

    def score(self, samples: list[Sample]) -> ScoreResult:
        n = len(samples)
        scores: list[float | None] = [None] * n
        errors: list[str | None] = [None] * n
        pending: dict[str, tuple[list[dict[str, str]], list[int]]] = {}
        hits = 0
        for i, sample in enumerate(samples):
            try:
                messages = self._render(sample)
            except (MissingField, TypeError) as exc:
                errors[i] = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
                continue
            key = hashlib.sha256(
                json.dumps([self.spec.identity, messages]).encode()
            ).hexdigest()  # fmt: skip
            if key in pending:  # the same input twice in one batch: sent once
                pending[key][1].append(i)
                hits += 1
            elif (outcome := self.context.cached(key)) is not None:
                scores[i], errors[i] = outcome
                hits += 1
            else:
                pending[key] = (messages, [i])
        outcomes = self._send({k: m for k, (m, _) in pending.items()}) if pending else {}
        for key, (_, items) in pending.items():
            for i in items:
                scores[i], errors[i] = outcomes[key]
        failed = sum(1 for e in errors if e is not None)
        self.context.count(self.name, cache_hits=hits, errors=failed)
        return scores, errors

    def _send(self, batch: dict[str, list[dict[str, str]]]) -> dict[str, tuple[Any, Any]]:
        """Each input's (score, error); parsed answers are cached, failures to answer not."""
        try:
            endpoint = self.context.endpoint(self.spec.endpoint_secret)
        except JudgeUnavailableError as exc:
            return {key: (None, f"judge unavailable: {exc}"[:_ERROR_CHARS]) for key in batch}
        pool, client = self._executor(), self._http(endpoint)
        futures: dict[str, Future[tuple[Any, Any, bool]]] = {
            key: pool.submit(self._call, client, endpoint, messages)
            for key, messages in batch.items()
        }
        wait_futures(futures.values(), timeout=self.context.deadline_s)
        outcomes: dict[str, tuple[Any, Any]] = {}
        for key, future in futures.items():
            if not future.done():
                future.cancel()
                deadline = self.context.deadline_s
                outcomes[key] = (None, f"judge timeout: no answer within {deadline:g} s")
                continue
            score, error, cacheable = future.result()
            outcomes[key] = (score, error)
            if cacheable:
                self.context.remember(key, (score, error))
        self.context.count(self.name, calls=len(batch))
        return outcomes

    def _call(
        self, client: httpx.Client, endpoint: JudgeEndpoint, messages: list[dict[str, str]]
    ) -> tuple[float | None, str | None, bool]:
        """(score, error, cacheable) for one input."""
        body = {"model": self.spec.model, "messages": messages, **self.spec.sampling}
        headers = dict(endpoint.headers)
        if endpoint.token:
            headers["Authorization"] = f"Bearer {endpoint.token}"
        started = time.perf_counter()
        try:
            r = client.post(
                endpoint.chat_url, json=body, headers=headers, extensions=endpoint.extensions
            )
        except httpx.HTTPError as exc:
            return None, f"judge unreachable: {type(exc).__name__}: {exc}"[:_ERROR_CHARS], False
        finally:
            self.context.count(self.name, seconds=time.perf_counter() - started)
        if r.status_code != 200:
            return None, f"judge answered {r.status_code}: {r.text}"[:_ERROR_CHARS], False
        try:
            answer = r.json()["choices"][0]["message"]["content"]
            if not isinstance(answer, str):
                raise TypeError("content is not text")
        except (ValueError, LookupError, TypeError) as exc:
            return None, f"judge answered no message: {exc}"[:_ERROR_CHARS], False
        try:
            return self.spec.read(answer), None, True
        except JudgeAnswerError as exc:
            return None, str(exc)[:_ERROR_CHARS], True

    def _http(self, endpoint: JudgeEndpoint) -> httpx.Client:
        if self._client is None:
            timeout = httpx.Timeout(endpoint.timeout_s, connect=10.0)
            self._client = httpx.Client(timeout=timeout, follow_redirects=False)
        return self._client

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.context.concurrency, f"judge-{self.name}"[:40])
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()


def open_judge(
    config: JudgeConfig | ModelGrader, name: str, judges: JudgeContext | None
) -> JudgeVerifier:
    """A model judge (a `judge` config or a score_model/label_model grader) sending through
    `judges`; JudgeUnavailableError where the opener has no judge endpoint."""
    if judges is None:
        raise JudgeUnavailableError(
            f"{name}: a model judge needs a judge endpoint, and none is configured here"
        )
    return JudgeVerifier(name, judge_spec(config), judges)
