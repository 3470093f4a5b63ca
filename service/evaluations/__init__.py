"""Evaluations: sample a model on a dataset, score the samples with verifiers, report pass@k."""
