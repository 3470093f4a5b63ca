"""What each loss of the Tinker API takes, by name: no torch, so the API checks a request with
the same table the engine runs it by (`workers/tinker/validation.py` reads it on both sides).

Every loss reads `target_tokens` (the learner's log-probs are taken of those) and sums a term
over the datum's tokens; `terms.py` registers each name's term. The SDK's other loss names are
refused with a reason (`REFUSED`): `custom` is the server-side path (`create_custom_loss`,
answered 501); the SDK's default custom loss runs client-side and needs nothing here: its
`forward_backward_custom` sends a `forward` and then a `forward_backward` with
`CLIENT_SIDE_CUSTOM` (cross_entropy) and `weights` = -dC/d logprobs, so the linear loss
-sum_t w_t * lp_t has the custom loss C's gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class LossSpec:
    name: str
    required: tuple[str, ...]  # loss_fn_inputs it needs, each as long as the datum's tokens
    optional: tuple[str, ...] = ()  # loss_fn_inputs it reads when present
    # loss_fn_config keys and their defaults (a per-token input of the same name wins)
    config: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def inputs(self) -> tuple[str, ...]:
        return (*self.required, *self.optional)


_TARGET = ("target_tokens",)
_POLICY = (*_TARGET, "logprobs", "advantages")  # the sampler's log-probs, A per token
# Ratio thresholds: Tinker's epsilon 0.2 on each side (asymmetric when set apart).
_CLIP = MappingProxyType({"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})

SPECS: Mapping[str, LossSpec] = MappingProxyType({
    spec.name: spec
    for spec in (
        LossSpec("cross_entropy", _TARGET, ("weights",)),
        LossSpec("importance_sampling", _POLICY),
        LossSpec("ppo", _POLICY, tuple(_CLIP), _CLIP),
        LossSpec("cispo", _POLICY, tuple(_CLIP), _CLIP),
        LossSpec("dro", _POLICY, (), MappingProxyType({"beta": 0.05})),
        LossSpec("gspo", _POLICY, (*_CLIP, "sequence_ratio_mask"), _CLIP),
    )
})  # fmt: skip

# Every loss_fn_inputs name the SDK sends (its Datum's key -> dtype table): a name outside it is
# a mistake the caller hears of; one a given loss does not use is ignored, as Tinker does.
KNOWN_INPUTS = frozenset(name for spec in SPECS.values() for name in spec.inputs)

CLIENT_SIDE_CUSTOM = "cross_entropy"  # the loss the SDK's forward_backward_custom sends
REFUSED: Mapping[str, str] = MappingProxyType({
    "custom": "server-side custom losses are not served; forward_backward_custom without "
              f"create_custom_loss runs the loss client-side over {CLIENT_SIDE_CUSTOM}",
    "stable_reinforce": "not implemented by this server",
})  # fmt: skip
