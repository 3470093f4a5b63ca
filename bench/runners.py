"""One benchmark training run, with TRL's GRPOTrainer or with this engine, in this process.

Both runs train the same model on the same task with the same reward and the same settings
(`Settings`): the digit task (`service/demo_task.py`, its reward written once here as a plain
function) or two-digit addition (`bench/addition.py`). Each run reports the wall time at the end
of every optimizer step, the completion tokens and the mean reward of every step, and the
process's peak RSS; with `held_out` > 0 (addition), also the greedy held-out accuracy of its
final weights, measured by the one function `addition.greedy_accuracy` for both trainers.
`vs_trl.py` and `real_model.py` start each run in its own subprocess.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.addition import addition_reward, addition_sets, greedy_accuracy

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Settings:
    steps: int = 30
    prompts_per_step: int = 2
    group_size: int = 8
    max_new_tokens: int = 32
    beta: float = 0.04
    learning_rate: float = 1e-3
    seed: int = 0
    device: str = "cpu"
    bf16: bool = False  # CUDA only: bf16 autocast (TRL's `bf16=True`)
    vllm: bool = False  # TRL: `use_vllm=True, vllm_mode="colocate"` (where vLLM is installed)
    threads: int | None = None  # torch intra-op threads for the whole run (None: torch's default)
    lora_r: int | None = (
        None  # a LoRA adapter of this rank (alpha 2r, all linear layers) is trained
    )
    engine: str | None = None  # ours: grpo.engine (None: the worker's GRPO_ENGINE, auto)
    off_policy: int = 0  # ours: grpo.max_off_policy_steps (where this engine has the field)
    task: str = "digit"  # or "addition" (bench/addition.py: chat prompts, a real chat model)
    held_out: int = 0  # addition: greedy accuracy on this many held-out sums after training
    # ours: the job's own defaults for what the settings above leave open (std, loss
    # aggregation) instead of TRL's (std "sample", token_mean), as a user's job would run
    job_defaults: bool = False


ADDITION_TRAIN = 400  # training sums; 30 steps x 4 prompts draw 120 of them


def digit_reward(completion: str, digit: int) -> float:
    """Share of completion characters equal to the named digit; other digits earn 0.3."""
    if not completion:
        return 0.0
    target = str(digit)
    points = sum(1.0 if c == target else (0.3 if c.isdigit() else 0.0) for c in completion)
    return points / len(completion)


def records(s: Settings | None = None) -> list[dict[str, Any]]:
    """The training records of the settings' task."""
    if s is not None and s.task == "addition":
        return addition_sets(ADDITION_TRAIN, s.held_out)[0]
    from service.demo_task import digit_records

    return digit_records(40, seed=0)


def task_reward(s: Settings) -> tuple[str, Any]:
    """The record field the task's reward reads, and the reward(completion, field value)."""
    return ("answer", addition_reward) if s.task == "addition" else ("digit", digit_reward)


def held_out_accuracy(model: Any, tokenizer: Any, s: Settings) -> dict[str, Any]:
    """Greedy accuracy of `model` on the held-out sums (empty when the run measures none)."""
    if not s.held_out:
        return {}
    held = addition_sets(ADDITION_TRAIN, s.held_out)[1]
    start = time.perf_counter()
    out = greedy_accuracy(model, tokenizer, held, s.max_new_tokens)
    return {"held_out": out | {"seconds": time.perf_counter() - start}}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _result(ends: list[float], start: float, tokens: list[float], rewards: list[float]) -> dict:
    seconds = [b - a for a, b in zip([start, *ends[:-1]], ends, strict=True)]
    return {
        "seconds": seconds,
        "tokens": tokens,
        "rewards": rewards,
        "rss_mib": peak_rss_mib(),
        "load": os.getloadavg()[0],  # the machine's 1-minute load average at the end
        "gpu_mib": _gpu_peak_mib(),
    }


def _gpu_peak_mib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def run_ours(model_dir: str, s: Settings) -> dict:
    """This engine through its public entry point, `workers.grpo.trainer.train`."""
    from workers.grpo.config import GRPOParams, TrainSpec
    from workers.grpo.trainer import TrainHooks, train

    field, reward = task_reward(s)

    class TaskScorer:
        name, weight = s.task, 1.0

        def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
            return [reward(x["completion"], x[field]) for x in samples], [None] * len(samples)

    matched = {} if s.job_defaults else {"std": "sample", "loss_aggregation": "token_mean"}

    spec = TrainSpec(
        base_model=model_dir,
        grpo={
            "steps": s.steps,
            "prompts_per_step": s.prompts_per_step,
            "group_size": s.group_size,
            "learning_rate": s.learning_rate,
            "beta": s.beta,
            **matched,  # std "sample": TRL's scale_rewards="group"; token_mean: TRL's "dapo"
            "seed": s.seed,
            **({"engine": s.engine} if s.engine else {}),
            **_off_policy(s.off_policy, GRPOParams.model_fields),
        },
        generation={"max_new_tokens": s.max_new_tokens},
        lora=None if s.lora_r is None else {"r": s.lora_r, "alpha": 2 * s.lora_r},
        checkpoint_every=10**6,
    )
    ends, tokens, rewards, split = [], [], [], {"generation": [], "training": []}

    def on_step(step: int, m: dict[str, float]) -> None:
        ends.append(time.perf_counter())
        tokens.append(m["completion_len_mean"] * s.prompts_per_step * s.group_size)
        rewards.append(m["reward_mean"])
        split["generation"].append(m["generation_seconds"])
        split["training"].append(m["training_seconds"])

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        result = train(
            spec,
            records(s),
            [TaskScorer()],
            Path(work),
            TrainHooks(on_step=on_step),
            device=s.device,
        )
        out = _result(ends, start, tokens, rewards) | {"split": split}
        if s.held_out and result.final_checkpoint is not None:
            out |= held_out_accuracy(*_load(str(result.final_checkpoint)), s)
    return out


def _load(model_dir: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(model_dir)


def run_base(model_dir: str, s: Settings) -> dict:
    """No training: the held-out accuracy of the model as it is (greedy, so seed-free)."""
    return held_out_accuracy(*_load(model_dir), s)


def _off_policy(steps: int, fields: dict) -> dict:
    """`max_off_policy_steps`, refused by name on an engine without the field."""
    if steps and "max_off_policy_steps" not in fields:
        raise SystemExit("this engine has no grpo.max_off_policy_steps: run --off-policy 0")
    return {"max_off_policy_steps": steps} if steps else {}


def run_trl(model_dir: str, s: Settings) -> dict:
    """TRL's GRPOTrainer with the same settings (its KL without the ratio correction)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    field, task = task_reward(s)

    def reward(completions: list[Any], **columns: Any) -> list[float]:
        return [task(c, v) for c, v in zip(completions, columns[field], strict=True)]

    ends, tokens, rewards = [], [], []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                rewards.append(logs["reward"])
                tokens.append(logs["completions/mean_length"] * s.prompts_per_step * s.group_size)

    with tempfile.TemporaryDirectory() as work:
        args = GRPOConfig(
            output_dir=work,
            per_device_train_batch_size=s.prompts_per_step * s.group_size,
            num_generations=s.group_size,
            max_completion_length=s.max_new_tokens,
            max_steps=s.steps,
            learning_rate=s.learning_rate,
            lr_scheduler_type="constant",
            beta=s.beta,
            loss_type="dapo",
            scale_rewards="group",
            use_bias_correction_kl=False,
            temperature=1.0,
            seed=s.seed,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=s.device == "cpu",
            bf16=s.bf16,
            gradient_checkpointing=False,
            use_vllm=s.vllm,
            vllm_mode="colocate",
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
            reward_funcs=reward,
            args=args,
            train_dataset=Dataset.from_list(records(s)),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            callbacks=[Clock()],
            peft_config=None if s.lora_r is None else _lora_config(s.lora_r),
        )
        start = time.perf_counter()
        trainer.train()
    out = _result(ends, start, tokens, rewards)
    return out | held_out_accuracy(trainer.model, trainer.processing_class, s)


def _lora_config(r: int) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM")


def run(which: str, model_dir: str, settings: dict) -> dict:
    s = Settings(**settings)
    if s.threads:
        import torch

        torch.set_num_threads(s.threads)
    out = {"trl": run_trl, "ours": run_ours, "base": run_base}[which](model_dir, s)
    return out | {"which": which, "settings": asdict(s)}
