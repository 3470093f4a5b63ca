"""The policy losses, each registered once by name (after veRL's `register_policy_loss`).

`registry` (torch-free, the API imports it) says what each loss takes: its `loss_fn_inputs`,
its `loss_fn_config` keys with their defaults. `terms` (torch) registers the implementation of
each name and holds the one clipped surrogate that Tinker's `ppo` and `gspo` and GRPO's
`grpo_loss` (workers/grpo/loss.py) share.
"""
