"""`open_verifier`: from a (kind, config) to a runnable Verifier."""

from __future__ import annotations

from typing import Any

from .base import Verifier
from .builtin import BUILDERS, FunctionVerifier
from .builtin_host import BuiltinHost, HostedVerifier
from .composite import Resolver, open_composite
from .config import JsonSchemaConfig, PythonConfig, parse_config
from .grader_config import StringCheckGrader, TextSimilarityGrader
from .grader_kind import open_grader
from .json_schema_kind import json_schema
from .judge import JudgeContext, open_judge
from .judge_config import JudgeConfig
from .python_kind import ChildLimits, PythonVerifier


def open_verifier(
    kind: str,
    config: dict[str, Any],
    *,
    name: str = "verifier",
    limits: ChildLimits | None = None,
    resolve: Resolver | None = None,
    host: BuiltinHost | None = None,
    judges: JudgeContext | None = None,
) -> Verifier:
    """Build a runnable verifier from a (validated or raw) config.

    Use it as a context manager; close() stops the sandbox of a `python` verifier, which is
    started lazily by the first score(). Raises VerifierConfigError for a bad config and
    SandboxUnavailableError for `python` when no sandbox is available (see sandbox_mode()).
    `limits` (python only) overrides the child's rlimits. `resolve(name, version)` ->
    (version, kind, config) is required for `composite` (see composite.py).

    Built-in kinds score in a helper process under a per-batch deadline (`builtin_host.py`):
    `host`'s, which the caller closes, or else one of their own, closed with the verifier.
    Model judges (`judge`, `score_model`, `label_model`) call out through `judges` (where they
    are sent, their cache and counters: `judge.py`); without one they raise
    JudgeUnavailableError.
    """
    own = host is None
    shared = BuiltinHost() if host is None else host

    def open_leaf(kind: str, config: dict[str, Any], name: str, limits: Any) -> Verifier:
        model = parse_config(kind, config)  # refuses a bad config here, not in the helper
        if isinstance(model, PythonConfig):
            return PythonVerifier(name, model, limits=limits)
        if isinstance(model, JudgeConfig):
            return open_judge(model, name, judges)
        if kind == "openai_grader":
            return open_grader(model, name, shared, limits, judges)  # type: ignore[arg-type]
        dumped = model.model_dump(mode="json", by_alias=True)
        return HostedVerifier(name, kind, dumped, shared, owns_host=False)

    try:
        if kind == "composite":
            if resolve is None:
                raise TypeError(
                    "a composite verifier needs resolve=(name, version) -> (version, kind, config)"
                )
            verifier = open_composite(config, resolve, open_leaf, name=name, limits=limits)
            if own:
                verifier.add_cleanup(shared.close)
            return verifier
        leaf = open_leaf(kind, config, name, limits)
    except BaseException:
        if own:
            shared.close()
        raise
    if own and isinstance(leaf, HostedVerifier):
        leaf.owns_host = True
    return leaf


def in_process_verifier(kind: str, config: dict[str, Any], name: str) -> FunctionVerifier:
    """A built-in kind scored in this very process: what the helper runs, without a deadline."""
    model = parse_config(kind, config)
    if isinstance(model, PythonConfig | JudgeConfig) or kind == "composite":
        raise ValueError(f"the {kind} kind does not run in process")
    if isinstance(model, JsonSchemaConfig):
        return FunctionVerifier(name, json_schema(model))
    if isinstance(model, StringCheckGrader | TextSimilarityGrader):
        # Imported here: the metric libraries load in the helper only, never in the API.
        from .grader_scoring import grader_function

        return FunctionVerifier(name, grader_function(model))
    if kind == "openai_grader":
        raise ValueError(f"the {getattr(model, 'type', kind)} grader does not run in process")
    return FunctionVerifier(name, BUILDERS[kind](model))
