"""Which rank a failed group's `rank_failed` event names, and with what message: the rank
that died, though its peer's failure on the broken collective reached the launcher first."""

from __future__ import annotations

from types import SimpleNamespace

from service.training.ranks import _culprit, _why

PEER_GONE = {"message": "RuntimeError: Connection closed by peer", "extraInfo": {}}


def test_the_rank_killed_is_named_not_the_peer_that_failed_first() -> None:
    failures = {
        0: SimpleNamespace(exitcode=1, message=PEER_GONE),  # seen first, error file written
        1: SimpleNamespace(exitcode=-9, message="Signal 9 (SIGKILL) received by PID 7"),
    }
    rank, failure = _culprit(failures)
    assert rank == 1 and _why(failure) == "Signal 9 (SIGKILL) received by PID 7"


def test_a_failure_with_an_error_file_reads_as_its_message() -> None:
    rank, failure = _culprit({0: SimpleNamespace(exitcode=1, message=PEER_GONE)})
    assert rank == 0 and _why(failure) == "RuntimeError: Connection closed by peer"
    assert _why(SimpleNamespace(exitcode=3, message="")) == "exit 3"
