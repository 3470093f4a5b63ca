"""Where a tenant's model judges send their calls: a `JudgeContext` for one job or one `/test`.

- No `endpoint_secret`: the operator's endpoint, GRPO_JUDGE_BASE_URL (an OpenAI-compatible
  base, `.../v1`, with GRPO_JUDGE_TOKEN), else the inference backend (GRPO_INFERENCE_URL with
  GRPO_INFERENCE_TOKEN: `grpo-service serve` resolves catalog names and checkpoint ids itself).
- `endpoint_secret: NAME`: the tenant's secret NAME holds `{"base_url": "https://.../v1",
  "api_key": "..."}`. Its host must resolve to public addresses only (the webhooks' rule,
  GRPO_JUDGE_ALLOW_PRIVATE opens private ones), and calls connect to the very address that was
  checked, so a DNS answer that changes later reaches nothing new.
"""

from __future__ import annotations

import json
from typing import Any

from service.core.db import session_scope
from service.secrets.crypto import SecretsUnavailable
from service.secrets.service import reveal
from service.settings import Settings
from service.webhooks import targets
from workers.verifiers import JudgeContext, JudgeEndpoint, JudgeUnavailableError


def operator_endpoint(settings: Settings) -> JudgeEndpoint:
    if settings.judge_base_url:
        token = settings.judge_token.get_secret_value() if settings.judge_token else None
        url = settings.judge_base_url.rstrip("/") + "/chat/completions"
        return JudgeEndpoint(url, token, settings.judge_timeout_s)
    if settings.inference_url:
        token = settings.inference_token.get_secret_value() if settings.inference_token else None
        url = settings.inference_url.rstrip("/") + "/v1/chat/completions"
        return JudgeEndpoint(url, token, settings.judge_timeout_s)
    raise JudgeUnavailableError(
        "no judge endpoint is configured (GRPO_JUDGE_BASE_URL or GRPO_INFERENCE_URL)"
    )


def _secret_value(value: str, name: str) -> tuple[str, str | None]:
    try:
        data: Any = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("base_url"), str):
        raise JudgeUnavailableError(
            f"secret '{name}' is not a judge endpoint: its value is JSON "
            '{"base_url": "https://.../v1", "api_key": "..."}'
        )
    key = data.get("api_key")
    return data["base_url"], key if isinstance(key, str) else None


def secret_endpoint(settings: Settings, tenant_id: str, name: str) -> JudgeEndpoint:
    """The external endpoint the tenant's secret `name` holds, checked and pinned."""
    try:
        with session_scope() as session:
            value = reveal(session, settings, tenant_id, name)
    except SecretsUnavailable as exc:
        raise JudgeUnavailableError(str(exc)) from None
    if value is None:
        raise JudgeUnavailableError(f"you have no secret '{name}'")
    base_url, api_key = _secret_value(value, name)
    try:
        target = targets.resolve(base_url.rstrip("/") + "/chat/completions",
                                 settings.judge_allow_private)  # fmt: skip
    except targets.TargetRefused as exc:
        raise JudgeUnavailableError(f"secret '{name}': {exc}") from None
    url = target.url
    extensions = {}
    if url.scheme == "https" and target.address != url.host:
        extensions["sni_hostname"] = url.host  # TLS and its certificate check: the name
    return JudgeEndpoint(
        str(url.copy_with(host=target.address)),
        api_key,
        settings.judge_timeout_s,
        headers={"host": url.netloc.decode("ascii")},
        extensions=extensions,
    )


def judge_context(settings: Settings, tenant_id: str) -> JudgeContext:
    """The context the judges of one job (or one `/test` call) of `tenant_id` share."""

    def endpoint_for(secret: str | None) -> JudgeEndpoint:
        if secret is None:
            return operator_endpoint(settings)
        return secret_endpoint(settings, tenant_id, secret)

    return JudgeContext(
        endpoint_for, concurrency=settings.judge_concurrency, deadline_s=settings.judge_deadline_s
    )
