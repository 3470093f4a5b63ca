"""Whether a run splits across N processes: checked before any process starts (`launch.py`),
and by the service at submission (`resources.devices`), which must not load torch."""

from __future__ import annotations

from workers.grpo.config import TrainSpec


class WorldSizeError(ValueError):
    """The spec cannot run on the asked number of processes; the message says why."""


def check_world(spec: TrainSpec, nproc: int, knob: str = "--nproc") -> None:
    """Raise WorldSizeError unless each of `nproc` processes gets the same whole groups
    (`knob`: how the message names the count, e.g. the service's `resources.devices`)."""
    g = spec.grpo
    if nproc < 1:
        raise WorldSizeError(f"{knob} must be at least 1, not {nproc}")
    if nproc == 1:
        return
    if nproc > g.prompts_per_step:
        raise WorldSizeError(
            f"{knob} {nproc} is more than the step's {g.prompts_per_step} groups"
            " (grpo.prompts_per_step): every process needs at least one whole group"
        )
    if g.prompts_per_step % nproc:
        raise WorldSizeError(
            f"grpo.prompts_per_step = {g.prompts_per_step} groups do not split into whole"
            f" groups across {nproc} processes: make it a multiple of {nproc}"
        )
    if g.skip_zero_std_groups:
        raise WorldSizeError(
            "grpo.skip_zero_std_groups (refilling flat groups) runs on one process only"
        )
    if spec.lora is not None and spec.lora.export_merged:
        raise WorldSizeError("lora.export_merged runs on one process only")
    if g.max_off_policy_steps:
        raise WorldSizeError(
            "grpo.max_off_policy_steps (rollouts generated ahead) runs on one process only"
        )
