"""The `composite` kind: a weighted sum of other registered verifiers, versions pinned.

The registry lives in the API's database, so this module never looks anything up itself: the
caller passes `resolve(name, version | None) -> (version, kind, config)` (`version=None`
means the latest). Two moments use it:
  - registration, `pin_composite(config, resolve)`: fills every part's version with the
    latest, walks nested composites (already pinned when they were registered), refuses cycles,
    depth > MAX_DEPTH and more than MAX_LEAVES leaf verifiers; the result is what is stored.
  - run time, `open_verifier("composite", stored, resolve=...)`: every part must be pinned;
    nested composites open recursively with the same checks.
A part's error on an item makes the item an error (naming the part); a part's
VerifierBudgetExceeded propagates and fails the job.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from .base import BaseVerifier, Sample, ScoreResult, Verifier
from .config import CompositeConfig, VerifierConfigError, parse_config
from .grader_config import grader_python_sandboxes

Resolver = Callable[[str, "int | None"], tuple[int, str, dict[str, Any]]]
MAX_DEPTH = 4
MAX_LEAVES = 32


def _resolve(resolve: Resolver, i: int, name: str, version: int | None) -> tuple[int, str, dict]:
    try:
        return resolve(name, version)
    except LookupError:
        label = name if version is None else f"{name} version {version}"
        raise VerifierConfigError([(("parts", i, "name"), f"no verifier {label}")]) from None


def _walk(
    cfg: CompositeConfig, resolve: Resolver, path: tuple[tuple[str, int], ...], pin: bool
) -> tuple[list[tuple[int, str, dict[str, Any]]], int]:
    """Resolve each part; returns [(version, kind, config)] and the number of leaves below."""
    if len(path) > MAX_DEPTH:
        chain = " -> ".join(f"{n}@{v}" for n, v in path)
        raise VerifierConfigError([(("parts",), f"composites nest too deep ({chain})")])
    resolved, leaves = [], 0
    for i, part in enumerate(cfg.parts):
        if part.version is None and not pin:
            raise VerifierConfigError(
                [(("parts", i, "version"), f"part {part.name!r} is not pinned to a version")]
            )
        version, kind, config = _resolve(resolve, i, part.name, part.version)
        if (part.name, version) in path:
            chain = " -> ".join(f"{n}@{v}" for n, v in (*path, (part.name, version)))
            raise VerifierConfigError([(("parts", i, "name"), f"cycle: {chain}")])
        if kind == "composite":
            inner = parse_config(kind, config)
            assert isinstance(inner, CompositeConfig)
            _, n = _walk(inner, resolve, (*path, (part.name, version)), pin=False)
            leaves += n
        else:
            leaves += 1
        resolved.append((version, kind, config))
    if leaves > MAX_LEAVES:
        raise VerifierConfigError(
            [(("parts",), f"{leaves} verifiers in all; at most {MAX_LEAVES}")]
        )
    return resolved, leaves


def pin_composite(config: dict[str, Any], resolve: Resolver, *, name: str = "") -> dict[str, Any]:
    """At registration: the normalised config with every part pinned to a version.

    `name` is the composite being registered (its new version is not resolvable yet; parts
    that name it resolve to its previous versions, which is not a cycle).
    Raises VerifierConfigError (unknown part, cycle, too deep, too many leaves).
    """
    cfg = parse_config("composite", config)
    assert isinstance(cfg, CompositeConfig)
    resolved, _ = _walk(cfg, resolve, ((name, 0),) if name else (), pin=True)
    for part, (version, _, _) in zip(cfg.parts, resolved, strict=True):
        part.version = version
    return cfg.model_dump(mode="json")


def python_leaves(kind: str, config: dict[str, Any], resolve: Resolver) -> int:
    """The python sandboxes opening this (stored) verifier starts: 1 for a python verifier,
    every python leaf below a composite (a part named twice opens twice), 0 otherwise. A part
    that no longer resolves counts 0: opening it reports the error."""
    if kind == "python":
        return 1
    if kind == "openai_grader":  # a python grader, or a multi grader's python graders
        return grader_python_sandboxes(config)
    return _python_leaves(config, resolve, 0) if kind == "composite" else 0


def _python_leaves(config: dict[str, Any], resolve: Resolver, depth: int) -> int:
    if depth > MAX_DEPTH:  # stored composites were checked at registration; stay bounded
        return 0
    n = 0
    for part in config.get("parts", []):
        try:
            _, kind, inner = resolve(part["name"], part.get("version"))
        except LookupError:
            continue
        if kind == "composite":
            n += _python_leaves(inner, resolve, depth + 1)
        else:
            n += python_leaves(kind, inner, resolve)
    return n


class CompositeVerifier(BaseVerifier):
    """Σ weight_k · score_k per item; closes its parts on close()."""

    def __init__(self, name: str, parts: list[tuple[str, float, Verifier]], stack: ExitStack):
        super().__init__(name)
        self.parts = parts
        self._stack = stack

    def score(self, samples: list[Sample]) -> ScoreResult:
        n = len(samples)
        totals: list[float | None] = [0.0] * n
        errors: list[str | None] = [None] * n
        for label, weight, verifier in self.parts:
            scores, errs = verifier.score(samples)
            for i in range(n):
                total = totals[i]
                if total is None:
                    continue
                if errs[i] is not None or scores[i] is None:
                    totals[i] = None
                    errors[i] = f"part {label}: {errs[i] or 'no score'}"[:500]
                else:
                    totals[i] = total + weight * scores[i]  # type: ignore[operator]
        return totals, errors

    def add_cleanup(self, fn: Callable[[], object]) -> None:
        """Run `fn` at close(), before the parts close (it is pushed last)."""
        self._stack.callback(fn)

    def close(self) -> None:
        self._stack.close()


# (kind, config, name, limits) -> a runnable leaf verifier: `factory.open_verifier` passes its
# own, so this module needs no import of the factory that imports it.
OpenLeaf = Callable[[str, dict[str, Any], str, Any], Verifier]


def open_composite(
    config: dict[str, Any],
    resolve: Resolver,
    open_leaf: OpenLeaf,
    *,
    name: str,
    limits: Any = None,
    _path: tuple[tuple[str, int], ...] = (),
) -> CompositeVerifier:
    """At run time: open every (pinned) part, recursively; refuses cycles like pin_composite."""
    cfg = parse_config("composite", config)
    assert isinstance(cfg, CompositeConfig)
    resolved, _ = _walk(cfg, resolve, _path, pin=False)
    with ExitStack() as stack:
        parts: list[tuple[str, float, Verifier]] = []
        inner: Verifier
        for part, (version, kind, conf) in zip(cfg.parts, resolved, strict=True):
            label = f"{part.name}@{version}"
            if kind == "composite":
                inner = open_composite(
                    conf, resolve, open_leaf, name=label, limits=limits,
                    _path=(*_path, (part.name, version)),
                )  # fmt: skip
            else:
                inner = open_leaf(kind, conf, f"{name}/{label}", limits)
            parts.append((label, part.weight, stack.enter_context(inner)))
        return CompositeVerifier(name, parts, stack.pop_all())
