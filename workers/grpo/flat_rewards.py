"""The flat-reward watch: steps whose groups all scored alike teach nothing.

GRPO's advantage is A_i = (r_i - mean(r_group)) / std(r_group) (Shao et al., 2024, eq. 3 with
outcome supervision): in a group whose G rewards are equal every A_i is 0, so the clipped
surrogate has no gradient and only the KL term moves the policy. A verifier that gives every
completion the same score (0 everywhere, say) therefore trains nothing while the job still
succeeds. The watch says so once per streak: when `frac_zero_std_groups` is at least
`threshold` for `steps` consecutive steps. A resumed attempt starts a new streak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FLAT_THRESHOLD = 0.9
FLAT_STEPS = 3


@dataclass
class FlatRewardWatch:
    threshold: float = FLAT_THRESHOLD
    steps: int = FLAT_STEPS
    streak: int = 0

    def observe(self, step: int, frac_zero_std: float) -> tuple[str, dict[str, Any]] | None:
        """The `warning` event's message and data at the step a streak reaches `steps`, else
        None (the streak goes on silently, and ends at the first step with enough spread)."""
        if frac_zero_std < self.threshold:
            self.streak = 0
            return None
        self.streak += 1
        if self.streak != self.steps:
            return None
        first = step - self.steps + 1
        message = (
            f"steps {first}-{step}: {frac_zero_std:.0%} of the groups scored alike"
            f" (frac_zero_std_groups >= {self.threshold}), so their advantages are 0 and these"
            " steps teach nothing; check that the verifiers' scores differ between completions"
            " of one prompt (`grpo verifiers test`), or raise group_size or the temperature"
        )
        data = {
            "reason": "flat_rewards",
            "step": step,
            "steps": self.steps,
            "frac_zero_std_groups": frac_zero_std,
        }
        return message, data
