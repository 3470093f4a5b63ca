"""`open_verifier`: from a (kind, config) to a runnable Verifier."""

from __future__ import annotations

from typing import Any

from .base import Verifier
from .builtin import BUILDERS, FunctionVerifier
from .composite import Resolver, open_composite
from .config import JsonSchemaConfig, PythonConfig, parse_config
from .json_schema_kind import json_schema
from .python_kind import ChildLimits, PythonVerifier


def open_verifier(
    kind: str,
    config: dict[str, Any],
    *,
    name: str = "verifier",
    limits: ChildLimits | None = None,
    resolve: Resolver | None = None,
) -> Verifier:
    """Build a runnable verifier from a (validated or raw) config.

    Use it as a context manager; close() stops the sandbox of a `python` verifier, which is
    started lazily by the first score(). Raises VerifierConfigError for a bad config and
    SandboxUnavailableError for `python` when no sandbox is available (see sandbox_mode()).
    `limits` (python only) overrides the child's rlimits. `resolve(name, version)` ->
    (version, kind, config) is required for `composite` (see composite.py).
    """
    if kind == "composite":
        if resolve is None:
            raise TypeError(
                "a composite verifier needs resolve=(name, version) -> (version, kind, config)"
            )
        return open_composite(config, resolve, _open_leaf, name=name, limits=limits)
    return _open_leaf(kind, config, name, limits)


def _open_leaf(
    kind: str, config: dict[str, Any], name: str, limits: ChildLimits | None
) -> Verifier:
    """Any kind but `composite` (whose parts open through this function)."""
    model = parse_config(kind, config)
    if isinstance(model, PythonConfig):
        return PythonVerifier(name, model, limits=limits)
    if isinstance(model, JsonSchemaConfig):
        return FunctionVerifier(name, json_schema(model))
    return FunctionVerifier(name, BUILDERS[kind](model))
