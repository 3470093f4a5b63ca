"""A run resumed with a changed spec (a fork's overrides) trains with the new learning rate, not
the one the checkpoint's optimizer state restored."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.workers.grpo.test_trainer import Recorder, _spec
from workers.grpo.trainer import train


def _delta(before: Path, after: Path) -> float:
    """The norm of the weights' change between two checkpoints."""
    a, b = load_file(before / "model.safetensors"), load_file(after / "model.safetensors")
    return torch.sqrt(sum(((b[k] - a[k]).double() ** 2).sum() for k in a)).item()


def test_a_changed_learning_rate_overrides_the_restored_one(
    tiny_model, digit_records, digit_scorer, tmp_path
):
    parent = Recorder(stop_after=2)
    train(
        _spec(tiny_model, steps=4, learning_rate=1e-3, checkpoint_every=2, beta=0.0),
        digit_records, [digit_scorer], tmp_path / "parent", parent,
    )  # fmt: skip
    step2 = parent.checkpoints[0][1]
    assert parent.checkpoints[0][0] == 2

    # Step 3 from the same checkpoint: same weights, data and RNG, so the same gradient; AdamW
    # (no weight decay) moves the weights by lr x the same direction. The parent had beta 0:
    # the resumed run with beta > 0 loads the reference it never had.
    moved = {}
    for lr in (1e-3, 4e-3):
        hooks = Recorder()
        spec = _spec(tiny_model, steps=3, learning_rate=lr, checkpoint_every=2, beta=0.04)
        result = train(spec, digit_records, [digit_scorer], tmp_path / f"lr{lr}", hooks,
                       resume_from=step2)  # fmt: skip
        assert sorted(hooks.metrics) == [3]  # step numbering goes on from the checkpoint
        assert hooks.metrics[3]["learning_rate"] == pytest.approx(lr, rel=1e-12)
        moved[lr] = _delta(step2, result.final_checkpoint)
    assert moved[4e-3] / moved[1e-3] == pytest.approx(4.0, rel=0.02)
