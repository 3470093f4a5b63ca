"""Prompt lengths in a catalog model's tokens, counted in the API without torch or
transformers: the model's fast tokenizer (`tokenizers`) and its chat template rendered in a
sandboxed Jinja environment, as the engine renders them (`workers.grpo.text.render_prompt`).

A template this renderer cannot run counts the messages' text alone: a lower bound, so a
refusal built on it is never wrong."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

Prompt = str | list[dict[str, str]]


def _raise(message: str) -> None:
    raise TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    # The options and helpers transformers gives chat templates.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now(UTC).strftime(fmt)
    return env


def longest_prompt_tokens(
    prompts: list[Prompt],
    tokenizer_json: str,
    chat_template: str | None,
    special_tokens: dict[str, str],
) -> int:
    """The most tokens any prompt takes, special tokens included."""
    tokenizer = Tokenizer.from_str(tokenizer_json)
    template = _environment().from_string(chat_template) if chat_template else None
    plain: list[str] = []
    templated: list[str] = []
    for prompt in prompts:
        if isinstance(prompt, str):
            plain.append(prompt)
            continue
        text = _render(template, prompt, special_tokens)
        if text is None:  # no template (the engine joins the contents) or one we cannot run
            plain.append("\n".join(m["content"] for m in prompt))
        else:
            templated.append(text)
    longest = 0
    for texts, special in ((plain, True), (templated, False)):
        if texts:
            encodings = tokenizer.encode_batch(texts, add_special_tokens=special)
            longest = max(longest, max(len(e.ids) for e in encodings))
    return longest


def _render(template: Any, messages: list[dict[str, str]], special: dict[str, str]) -> str | None:
    if template is None:
        return None
    try:
        return template.render(messages=messages, add_generation_prompt=True, **special)
    except Exception:  # noqa: BLE001 - an unusual template: fall back to the lower bound
        return None
