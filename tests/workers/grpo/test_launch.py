"""The launcher hands back every rank's classified error, whichever rank the launcher saw fail
first (torch elastic's `ChildFailedError` lists only the failures it saw at once)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from workers.grpo.launch import launch, record_error, recorded_error


def _rank_1_errs_and_exits_after_rank_0(marker: str) -> int:
    """Rank 1 records a classified error (as a rank whose verifier's budget ran out does) and
    leaves only after rank 0 has failed unclassified (as a rank whose collective lost its peer
    does): the launcher sees rank 0's exit first."""
    if os.environ["RANK"] == "1":
        record_error(ValueError("budget spent"), {"code": "verifier_budget", "message": "spent"})
        Path(marker).touch()
        time.sleep(30)  # stopped by the launcher once it has seen rank 0 fail
        raise SystemExit(1)
    while not Path(marker).exists():
        time.sleep(0.05)
    raise SystemExit(1)


def test_a_classified_error_on_a_rank_that_exits_last_is_read(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with pytest.raises(ChildFailedError) as failed:
        launch(2, _rank_1_errs_and_exits_after_rank_0, str(tmp_path / "m"), log_dir=str(logs))
    assert sorted(failed.value.failures) == [0]  # the launcher listed rank 0's failure alone
    assert recorded_error(logs) == (1, {"code": "verifier_budget", "message": "spent"})


def _no_error() -> int:
    raise SystemExit(1)


def test_ranks_that_failed_unclassified_have_no_recorded_error(tmp_path: Path) -> None:
    with pytest.raises(ChildFailedError):
        launch(2, _no_error, log_dir=str(tmp_path))
    assert recorded_error(tmp_path) is None
