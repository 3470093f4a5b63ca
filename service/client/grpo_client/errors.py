"""Client errors: an API answer that is not a success, or a server that cannot be reached."""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Base of every error the client raises on purpose."""


class ApiError(ClientError):
    """A non-2xx answer; `problem` is its RFC 9457 problem+json body (or a stand-in)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        super().__init__(self.message)

    @property
    def title(self) -> str:
        return str(self.problem.get("title") or f"HTTP {self.status}")

    @property
    def detail(self) -> str:
        return str(self.problem.get("detail") or "")

    @property
    def errors(self) -> list[dict[str, Any]]:
        return list(self.problem.get("errors") or [])

    @property
    def message(self) -> str:
        lines = [f"{self.status} {self.title}" + (f": {self.detail}" if self.detail else "")]
        shown = {self.detail}
        for err in self.errors:
            line = f"{err.get('path', '?')}: {err.get('message', '')}"
            if line not in shown:
                lines.append(f"  {line}")
        return "\n".join(lines)

    @classmethod
    def local(cls, status: int, title: str, detail: str) -> ApiError:
        """An answer the client works out itself (no checkpoint at that step, no dataset of
        that name), shaped as the server's would be."""
        return cls(status, {"type": "about:blank", "title": title, "status": status,
                            "detail": detail})  # fmt: skip


class ConnectionFailed(ClientError):
    """The server could not be reached (after the retries)."""


class ChecksumMismatch(ClientError):
    """A downloaded checkpoint's sha256 differs from the one the API lists."""
