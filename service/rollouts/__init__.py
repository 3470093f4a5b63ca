"""Rollouts: the completions each step of a job sampled, read back from the rollout store."""
