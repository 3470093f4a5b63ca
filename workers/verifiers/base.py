"""The Verifier protocol shared by every kind."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

# {"prompt": str | [{role, content}], "completion": str, **record fields}
Sample = dict[str, Any]
ScoreResult = tuple[list[float | None], list[str | None]]


@runtime_checkable
class Verifier(Protocol):
    name: str

    def score(self, samples: list[Sample]) -> ScoreResult:
        """Per-sample score (None on error) and error text (None when ok), same length."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Verifier: ...

    def __exit__(self, *exc: object) -> None: ...


class BaseVerifier:
    """Context-manager plumbing; subclasses implement score() and, if needed, close()."""

    def __init__(self, name: str):
        self.name = name

    def score(self, samples: list[Sample]) -> ScoreResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
