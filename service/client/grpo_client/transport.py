"""HTTP plumbing of the client: auth, retries with backoff, idempotency keys, problem+json.

Retried: 429, 502, 503 and 504 answers (honouring `Retry-After`) and connection errors. Every
request is safe to retry: creating POSTs carry an `Idempotency-Key` that stays the same across
the retries of one call, so the server replays the first answer instead of creating twice.
"""

from __future__ import annotations

import email.utils
import random
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from grpo_client.errors import ApiError, ConnectionFailed

RETRY_STATUSES = frozenset({429, 502, 503, 504})
USER_AGENT = "grpo-client/0.1"


def retry_after_seconds(response: httpx.Response) -> float | None:
    """The `Retry-After` header as seconds: delta-seconds or an HTTP date."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def problem_of(response: httpx.Response) -> dict[str, Any]:
    """The problem+json body, or a stand-in built from the status and text."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "status" in body:
        return body
    if isinstance(body, dict) and "detail" in body:  # a plain FastAPI/Starlette error
        return {"title": response.reason_phrase, "status": response.status_code, **body}
    try:
        text = response.text.strip()[:500]
    except httpx.ResponseNotRead:
        text = ""
    return {"title": response.reason_phrase, "status": response.status_code, "detail": text}


class Transport:
    """One `httpx.Client` with the key, the retry policy and error mapping."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout: float = 30.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        http: httpx.Client | None = None,
    ) -> None:
        headers = {"User-Agent": USER_AGENT}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.http = http or httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, follow_redirects=True
        )

    def close(self) -> None:
        self.http.close()

    def delay(self, attempt: int, response: httpx.Response | None = None) -> float:
        """Seconds before retry `attempt` (0-based): Retry-After if given, else exponential
        backoff with full jitter."""
        hinted = retry_after_seconds(response) if response is not None else None
        if hinted is not None:
            return min(hinted, self.max_backoff)
        return random.uniform(0, min(self.max_backoff, self.backoff * 2**attempt))

    def request(
        self,
        method: str,
        path: str,
        *,
        creates: bool = False,
        idempotency_key: str | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send with retries; raise ApiError on a non-2xx answer, ConnectionFailed when the
        server stays unreachable. `creates` adds an Idempotency-Key (fixed for all retries)."""
        headers = dict(kwargs.pop("headers", None) or {})
        if creates:
            headers.setdefault("Idempotency-Key", idempotency_key or str(uuid.uuid4()))
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = self.http.request(method, path, headers=headers, **kwargs)
            except httpx.TransportError as exc:
                if last:
                    raise ConnectionFailed(f"cannot reach {self.base_url}: {exc}") from exc
                time.sleep(self.delay(attempt))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                time.sleep(self.delay(attempt, response))
                continue
            if response.is_error:
                raise ApiError(response.status_code, problem_of(response))
            return response
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        return response.json() if response.content else None

    @contextmanager
    def stream(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """One streamed request, no retries (callers resume); errors mapped as above."""
        try:
            with self.http.stream(method, path, **kwargs) as response:
                if response.is_error:
                    response.read()
                    raise ApiError(response.status_code, problem_of(response))
                yield response
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"cannot reach {self.base_url}: {exc}") from exc
