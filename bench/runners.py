"""One benchmark training run, with TRL's GRPOTrainer or with this engine, in this process.

Both runs train the same model on the digit task (`service/demo_task.py`) with the same reward,
written once here as a plain function, and the same settings (`Settings`). Each run reports the
wall time at the end of every optimizer step, the completion tokens and the mean reward of every
step, and the process's peak RSS. `vs_trl.py` starts each run in its own subprocess.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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


def digit_reward(completion: str, digit: int) -> float:
    """Share of completion characters equal to the named digit; other digits earn 0.3."""
    if not completion:
        return 0.0
    target = str(digit)
    points = sum(1.0 if c == target else (0.3 if c.isdigit() else 0.0) for c in completion)
    return points / len(completion)


def records() -> list[dict[str, Any]]:
    from service.demo_task import digit_records

    return digit_records(40, seed=0)


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

    class DigitScorer:
        name, weight = "digit", 1.0

        def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
            return [digit_reward(x["completion"], x["digit"]) for x in samples], [None] * len(
                samples
            )

    spec = TrainSpec(
        base_model=model_dir,
        grpo={
            "steps": s.steps,
            "prompts_per_step": s.prompts_per_step,
            "group_size": s.group_size,
            "learning_rate": s.learning_rate,
            "beta": s.beta,
            "std": "sample",  # TRL's scale_rewards="group"
            "loss_aggregation": "token_mean",  # TRL's "dapo"
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
        train(
            spec,
            records(),
            [DigitScorer()],
            Path(work),
            TrainHooks(on_step=on_step),
            device=s.device,
        )
    return _result(ends, start, tokens, rewards) | {"split": split}


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

    def reward(completions: list[str], digit: list[int], **_: Any) -> list[float]:
        return [digit_reward(c, d) for c, d in zip(completions, digit, strict=True)]

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
            train_dataset=Dataset.from_list(records()),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            callbacks=[Clock()],
            peft_config=None if s.lora_r is None else _lora_config(s.lora_r),
        )
        start = time.perf_counter()
        trainer.train()
    return _result(ends, start, tokens, rewards)


def _lora_config(r: int) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM")


def run(which: str, model_dir: str, settings: dict) -> dict:
    s = Settings(**settings)
    if s.threads:
        import torch

        torch.set_num_threads(s.threads)
    out = (run_trl if which == "trl" else run_ours)(model_dir, s)
    return out | {"which": which, "settings": asdict(s)}
