"""Checks of a job spec against its model that need no GPU, run at submission so that a job
the worker would fail is refused with the field to change: prompts that do not fit the
context or a packed micro-batch, chat prompts without a chat template, LoRA target modules
the architecture lacks, a decoding engine that cannot serve the model, a queue no worker is
declared for."""

from __future__ import annotations

import json
from typing import Any

import re2

from service.catalog.prompts import longest_prompt_tokens
from service.core.problems import FieldError
from service.jobs.schemas import JobCreate
from service.models import CatalogModel, Dataset
from service.settings import Settings
from service.storage import ObjectStorage
from workers.grpo.memory import MemoryEstimate, ModelShape, estimate_memory, select_lora_targets
from workers.grpo.paged_support import paged_refusal

GIB = 1 << 30


def check_queue(body: JobCreate, settings: Settings) -> list[FieldError]:
    if body.queue in settings.queues:
        return []
    known = ", ".join(sorted(settings.queues)) or "none"
    return [
        FieldError(path="$.queue", message=f"no queue {body.queue!r} (this service runs: {known})")
    ]


def _re2_fullmatch(pattern: str, name: str) -> bool:
    try:
        return re2.fullmatch(pattern, name) is not None
    except re2.error:  # refused by check_lora_targets with the reason
        return False


def lora_targets(body: JobCreate, model: CatalogModel) -> list[str]:
    """The modules the job's adapter wraps, matched as peft matches them (patterns on RE2)."""
    if body.lora is None:
        return []
    return select_lora_targets(model.lora_targets, body.lora.target_modules, _re2_fullmatch)


def check_lora_targets(body: JobCreate, model: CatalogModel) -> list[FieldError]:
    """peft's rules: 'all-linear'; a list of names, each matching a module's last name parts;
    any other string, a regular expression over full module names (run on RE2 here)."""
    if body.lora is None or body.lora.target_modules == "all-linear":
        return []
    targets = body.lora.target_modules
    if isinstance(targets, str):
        try:
            re2.compile(targets)
        except re2.error as exc:
            reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
            message = f"not a regular expression: {reason}"
            return [FieldError(path="$.lora.target_modules", message=message)]
        if lora_targets(body, model):
            return []
        return [_no_module("$.lora.target_modules", targets, model)]
    return [
        _no_module(f"$.lora.target_modules[{i}]", t, model)
        for i, t in enumerate(targets)
        if not select_lora_targets(model.lora_targets, [t], _re2_fullmatch)
    ]


def check_engine(body: JobCreate, model: CatalogModel) -> list[FieldError]:
    """`grpo.engine: paged` only on a model family continuous batching serves (the worker
    refuses the same ones: `workers.grpo.paged.serving_refusal`)."""
    if body.grpo.engine != "paged":
        return []
    reason = paged_refusal(model.model_type)
    return [] if reason is None else [FieldError(path="$.grpo.engine", message=reason)]


def model_shape(model: CatalogModel) -> ModelShape:
    return ModelShape(
        num_parameters=model.num_parameters,
        hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size,
        num_layers=model.num_layers,
        kv_dim=model.kv_dim,
        vocab_size=model.vocab_size,
        modules=model.lora_targets,
    )


def check_memory(
    body: JobCreate, model: CatalogModel, prompt_tokens: int, settings: Settings
) -> tuple[MemoryEstimate, list[FieldError]]:
    """The run's estimated peak memory on one of its `resources.devices` devices (sharded
    across them: `memory.estimate_memory`), refused when it exceeds a device of the queue.
    Rollout devices hold a whole copy of the model and no optimiser: the trainer's is larger."""
    devices = body.resources.devices - body.resources.rollout_devices
    estimate = estimate_memory(
        model_shape(model), body, prompt_tokens, lora_targets(body, model), devices
    )
    queue = settings.queues.get(body.queue)
    limit = queue.device_memory_gib if queue else None
    if limit is None or estimate.total <= limit * GIB:
        return estimate, []
    parts = ", ".join(
        f"{name} {value / GIB:.2f}" for name, value in estimate.as_dict().items() if name != "total"
    )
    where = "" if devices == 1 else f" per device on {devices} devices"
    message = (
        f"estimated peak memory {estimate.total / GIB:.2f} GiB{where} ({parts}) exceeds the "
        f"{limit:g} GiB of a device of queue {body.queue!r}: lower prompts_per_step x "
        "group_size, max_new_tokens or micro_batch_size, train a LoRA adapter, or shard the "
        "run across more devices (resources.devices)"
    )
    return estimate, [FieldError(path="$.queue", message=message)]


def _no_module(path: str, target: str, model: CatalogModel) -> FieldError:
    leaves = sorted({n.rsplit(".", 1)[-1] for n in model.lora_targets})
    return FieldError(
        path=path,
        message=f"{model.architecture} has no module {target!r} LoRA can wrap "
        f"(it has: {', '.join(leaves)})",
    )


def check_prompts(
    body: JobCreate, model: CatalogModel, datasets: dict[str, Dataset], storage: ObjectStorage
) -> list[FieldError]:
    """Every dataset's longest prompt plus `max_new_tokens` fits the context; chat prompts
    have a template to render them."""
    errors = []
    for field, dataset in datasets.items():
        stats = prompt_stats(dataset, model, storage)
        if stats["chat"] and not model.has_chat_template:
            errors.append(
                FieldError(
                    path=f"$.{field}",
                    message=f"{dataset.id} holds chat-message prompts and {model.name} has no "
                    "chat template: use a chat model or plain-text prompts",
                )
            )
        tokens = stats["tokens"].get(_model_key(model))
        if tokens is not None and tokens + body.generation.max_new_tokens > model.context_length:
            errors.append(
                FieldError(
                    path="$.generation.max_new_tokens",
                    message=f"the longest prompt of {dataset.id} is {tokens} tokens: with "
                    f"max_new_tokens {body.generation.max_new_tokens} it exceeds the context "
                    f"length of {model.name} ({model.context_length})",
                )
            )
    return errors


def check_micro_batch_tokens(body: JobCreate, prompt_tokens: int) -> list[FieldError]:
    """A packed micro-batch holds the longest sequence: the longest prompt (`prompt_tokens`,
    at least one token when unmeasured) plus `max_new_tokens`."""
    budget, longest = body.grpo.micro_batch_tokens, max(prompt_tokens, 1)
    sequence = longest + body.generation.max_new_tokens
    if budget is None or budget >= sequence:
        return []
    message = (
        f"{budget} tokens cannot hold the longest sequence: the longest prompt ({longest} tokens)"
        f" + max_new_tokens ({body.generation.max_new_tokens}) = {sequence}"
    )
    return [FieldError(path="$.grpo.micro_batch_tokens", message=message)]


def longest_prompt(model: CatalogModel, datasets: dict[str, Dataset]) -> int:
    """The longest prompt of the job's datasets in the model's tokens (0 when unmeasured: a
    model without a fast tokenizer); call after check_prompts, which measures them."""
    key = _model_key(model)
    return max((d.prompt_stats.get("tokens", {}).get(key, 0) for d in datasets.values()), default=0)


def _model_key(model: CatalogModel) -> str:
    return f"{model.name}@{model.revision}"


def chat_flag(records: list[dict[str, Any]]) -> bool:
    return any(isinstance(r.get("prompt"), list) for r in records)


def prompt_stats(dataset: Dataset, model: CatalogModel, storage: ObjectStorage) -> dict[str, Any]:
    """The dataset's statistics for this model, measured once and kept on the dataset row."""
    stats = {"tokens": {}, **(dataset.prompt_stats or {})}
    key = _model_key(model)
    if "chat" in stats and (key in stats["tokens"] or model.tokenizer_key is None):
        return stats
    data = storage.get_bytes(dataset.object_key)
    prompts = [json.loads(line)["prompt"] for line in data.decode().splitlines() if line.strip()]
    stats["chat"] = any(isinstance(p, list) for p in prompts)
    if model.tokenizer_key is not None:
        tokenizer_json = storage.get_bytes(model.tokenizer_key).decode()
        stats["tokens"] = {
            **stats["tokens"],
            key: longest_prompt_tokens(
                prompts, tokenizer_json, model.chat_template, model.special_tokens
            ),
        }
    dataset.prompt_stats = stats  # a new dict: the JSON column sees the change
    return stats
