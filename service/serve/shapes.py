"""OpenAI's response objects, built from the engine's results: chat completions, text
completions, their stream chunks, usage, log-probs and errors."""

from __future__ import annotations

import secrets
import time
from typing import Any

from workers.inference.params import Choice, TokenLogprob


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


def error_body(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _entry(t: TokenLogprob) -> dict[str, Any]:
    return {"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode())}


def chat_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    content = [
        {
            **_entry(t),
            "top_logprobs": [_entry(TokenLogprob(tok, lp)) for tok, lp in t.top],
        }
        for t in tokens
    ]
    return {"content": content, "refusal": None}


def text_logprobs(tokens: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [dict(t.top) for t in tokens],
        "text_offset": offsets,
    }


def chat_choice(choice: Choice, index: int, with_logprobs: bool) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": choice.text, "refusal": None},
        "finish_reason": choice.finish_reason,
        "logprobs": chat_logprobs(choice.logprobs) if with_logprobs else None,
    }


def text_choice(choice: Choice, index: int, with_logprobs: bool) -> dict[str, Any]:
    return {
        "index": index,
        "text": choice.text,
        "finish_reason": choice.finish_reason,
        "logprobs": text_logprobs(choice.logprobs) if with_logprobs else None,
    }


def completion(
    kind: str, cid: str, model: str, choices: list[dict[str, Any]], use: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": now(),
        "model": model,
        "choices": choices,
        "usage": use,
        "system_fingerprint": None,
    }


def chunk(
    kind: str, cid: str, model: str, choices: list[dict[str, Any]], use: dict | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": now(),
        "model": model,
        "choices": choices,
        "system_fingerprint": None,
    }
    if use is not None:
        body["usage"] = use
    return body


def delta_choice(
    kind: str,
    index: int,
    text: str | None,
    tokens: list[TokenLogprob] | None,
    finish_reason: str | None = None,
    role: bool = False,
) -> dict[str, Any]:
    """One choice of a stream chunk: a text delta, its tokens' log-probs, or the finish."""
    if kind == "chat":
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        return {
            "index": index,
            "delta": delta,
            "finish_reason": finish_reason,
            "logprobs": chat_logprobs(tokens) if tokens else None,
        }
    return {
        "index": index,
        "text": text or "",
        "finish_reason": finish_reason,
        "logprobs": text_logprobs(tokens) if tokens else None,
    }
