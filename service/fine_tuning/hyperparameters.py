"""OpenAI's reinforcement hyperparameters onto GRPO knobs (docs/fine-tuning.md has the table).

OpenAI's `batch_size` is the examples of one step: our `prompts_per_step`. Its epochs become a
step count over the training file. `compute_multiplier` scales the exploration per prompt: the
group size G. The learning rate is a multiple of our default. `eval_interval` is our
`eval_every`, and a checkpoint is saved at each eval point. `eval_samples` and
`reasoning_effort` have no GRPO knob here: they are kept on the job as sent (see the docs).
"""

from __future__ import annotations

import math
from typing import Any

from service.fine_tuning.schemas import ReinforcementHyperparameters
from workers.grpo.config import GRPOParams

DEFAULT_BATCH_SIZE = GRPOParams.model_fields["prompts_per_step"].default  # 4
DEFAULT_GROUP_SIZE = GRPOParams.model_fields["group_size"].default  # 8
BASE_LEARNING_RATE = GRPOParams.model_fields["learning_rate"].default  # 1e-5
MAX_GROUP_SIZE = 1024
EVALS_PER_RUN = 4  # `eval_interval: auto`: four eval (and checkpoint) points in a run


def _given(value: Any, auto: Any) -> Any:
    return auto if value == "auto" else value


def resolve(hp: ReinforcementHyperparameters, num_records: int) -> tuple[dict, dict, dict]:
    """(the hyperparameters with `auto` resolved, as the job shows them; our `grpo` knobs;
    our cadence fields `eval_every`, `checkpoint_every`)."""
    batch = _given(hp.batch_size, min(DEFAULT_BATCH_SIZE, max(1, num_records)))
    epochs = _given(hp.n_epochs, 1)
    steps = max(1, math.ceil(epochs * num_records / batch))
    lr_multiplier = float(_given(hp.learning_rate_multiplier, 1.0))
    compute = float(_given(hp.compute_multiplier, 1.0))
    group = min(MAX_GROUP_SIZE, max(2, round(DEFAULT_GROUP_SIZE * compute)))
    interval = _given(hp.eval_interval, max(1, math.ceil(steps / EVALS_PER_RUN)))
    shown = {
        "batch_size": batch,
        "compute_multiplier": compute,
        "eval_interval": interval,
        "eval_samples": hp.eval_samples,
        "learning_rate_multiplier": lr_multiplier,
        "n_epochs": epochs,
        "reasoning_effort": hp.reasoning_effort or "default",
    }
    grpo = {
        "steps": steps,
        "prompts_per_step": batch,
        "group_size": group,
        "learning_rate": min(1.0, BASE_LEARNING_RATE * lr_multiplier),
    }
    return shown, grpo, {"eval_every": interval, "checkpoint_every": interval}


# Where a refusal of a mapped knob points in the OpenAI request.
KNOB_PATHS = {
    "$.base_model": "$.model",
    "$.dataset": "$.training_file",
    "$.eval_dataset": "$.validation_file",
    "$.grpo.prompts_per_step": "$.method.reinforcement.hyperparameters.batch_size",
    "$.grpo.group_size": "$.method.reinforcement.hyperparameters.compute_multiplier",
    "$.grpo.steps": "$.method.reinforcement.hyperparameters.n_epochs",
    "$.grpo.learning_rate": "$.method.reinforcement.hyperparameters.learning_rate_multiplier",
    "$.grpo.seed": "$.seed",
    "$.eval_every": "$.method.reinforcement.hyperparameters.eval_interval",
    "$.checkpoint_every": "$.method.reinforcement.hyperparameters.eval_interval",
}
