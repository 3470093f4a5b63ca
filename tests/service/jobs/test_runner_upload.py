"""Checkpoint uploads are retried and verified before a row may point at them."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.storage import LocalStorage
from service.training import uploads


class FlakyStorage(LocalStorage):
    """Fails the first uploads, then truncates one, then works: storage outside our control."""

    def __init__(self, root: Path, failures: list[str]) -> None:
        super().__init__(root)
        self.failures = failures

    def put_file(self, key: str, path: Path) -> None:
        failure = self.failures.pop(0) if self.failures else None
        if failure == "raise":
            raise ConnectionError("storage unreachable")
        if failure == "truncate":
            self.put_bytes(key, path.read_bytes()[:10])
            return
        super().put_file(key, path)


def test_upload_retries_until_stored_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uploads.time, "sleep", lambda _s: None)
    archive = tmp_path / "a.tar"
    archive.write_bytes(b"x" * 1000)
    storage = FlakyStorage(tmp_path / "objects", ["raise", "truncate"])
    uploads.upload_verified(storage, "k/step-1.tar", archive, 1000)
    assert storage.get_bytes("k/step-1.tar") == b"x" * 1000


def test_upload_gives_up_with_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uploads.time, "sleep", lambda _s: None)
    archive = tmp_path / "a.tar"
    archive.write_bytes(b"x" * 1000)
    storage = FlakyStorage(tmp_path / "objects", ["raise"] * 4)
    with pytest.raises(ConnectionError, match="unreachable"):
        uploads.upload_verified(storage, "k/step-1.tar", archive, 1000)


def test_a_non_finite_run_fails_with_its_documented_code() -> None:
    """The engine's NonFiniteTraining becomes the job's `non_finite_training` (docs/api.md);
    anything unnamed stays `internal_error`."""
    from workers.grpo.trainer import NonFiniteTraining

    assert uploads.error_code(NonFiniteTraining("step 3: grad_norm = nan")) == "non_finite_training"
    assert uploads.error_code(ValueError("unexpected")) == "internal_error"
