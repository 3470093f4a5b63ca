"""The tracker fan-out against each tracker's real local store: MLflow's sqlite:// store, a W&B
offline run, TensorBoard event files, Trackio's local SQLite; and failures as one warning."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.workers.tracking.readers import scalars, tensorboard_texts, wandb_history
from workers.tracking import SAMPLE_COLUMNS, Trackers, TrackingConfig, open_trackers

SPEC: dict[str, Any] = {
    "base_model": "tiny",
    "grpo": {"steps": 5, "group_size": 4},
    "report_to": [],
}


def _metrics(step: int) -> dict[str, Any]:
    return {"reward_mean": step / 10, "loss": 1.0 - step / 10, "stopped": True}


def _rows(step: int) -> list[dict[str, Any]]:
    return [
        {"step": step, "group": 0, "index": i, "prompt": "Digit:", "completion": f"{i} |x",
         "reward": float(i), "advantage": i - 0.5, "extra": "dropped"}
        for i in range(2)
    ]  # fmt: skip


class Warnings(list[tuple[str, str]]):
    def __call__(self, tracker: str, reason: str) -> None:
        self.append((tracker, reason))


def _attempt(config: TrackingConfig, job_id: str, steps: range, status: str) -> Warnings:
    """One attempt at a job: start, a step's metrics and samples each step, finish."""
    warnings = Warnings()
    trackers = open_trackers(config, warnings)
    trackers.start(job_id, "my run", SPEC)
    for step in steps:
        trackers.log_metrics(step, _metrics(step))
        trackers.log_samples(step, "train", _rows(step))
    trackers.finish(status)
    return warnings


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tracker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trackers")


def test_mlflow_one_run_per_job_and_a_later_attempt_continues_it(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = TrackingConfig(report_to=["mlflow"], project="exp", mlflow_tracking_uri=uri)
    assert _attempt(config, "job_a", range(1, 4), "running") == []  # released at step 3
    config.resume_step = 2  # its checkpoint: step 3 is redone
    assert _attempt(config, "job_a", range(3, 6), "succeeded") == []

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("exp")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.data.tags["grpo.job_id"] == "job_a" and run.info.status == "FINISHED"
    assert run.info.run_name == "my run"
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert [(m.step, m.value) for m in history] == [(s, s / 10) for s in range(1, 6)]
    assert "stopped" not in run.data.metrics  # flags are no curves
    assert run.data.params["grpo.steps"] == "5" and run.data.params["base_model"] == "tiny"
    assert run.data.params["report_to"] == "[]"
    table_path = Path(
        client.download_artifacts(run.info.run_id, "samples/train.json", str(tmp_path))
    )
    table = json.loads(table_path.read_text())
    assert table["columns"] == list(SAMPLE_COLUMNS)
    steps = [row[0] for row in table["data"]]
    assert steps == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]  # step 3's samples once, not again on redo


def test_wandb_offline_run_holds_every_step_and_the_sample_table(tracker_dir: Path) -> None:
    config = TrackingConfig(report_to=["wandb"], project="p", tracker_dir=tracker_dir)
    assert _attempt(config, "job_wandb", range(1, 4), "succeeded") == []
    (run_file,) = (tracker_dir / "wandb" / "wandb").glob(
        "offline-run-*-job_wandb/run-job_wandb.wandb"
    )
    history = wandb_history(run_file)
    assert [int(h["_step"]) for h in history] == [1, 2, 3]
    assert [float(h["reward_mean"]) for h in history] == [0.1, 0.2, 0.3]
    assert all(h["samples/train/_type"] == '"table-file"' for h in history)
    assert all(h["samples/train/nrows"] == "2" for h in history)


def test_tensorboard_a_resumed_attempt_replaces_the_steps_it_redoes(tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    config = TrackingConfig(report_to=["tensorboard"], tensorboard_dir=logdir)
    _attempt(config, "job_tb", range(1, 4), "running")
    config.resume_step = 2
    assert _attempt(config, "job_tb", range(3, 5), "succeeded") == []
    assert [s for s, _ in scalars(logdir, "reward_mean")] == [1, 2, 3, 4]
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2
    # The purge covers scalars; TensorBoard's accumulator keeps text (tensors) of both attempts.
    assert sorted(set(tensorboard_texts(logdir, "samples/train/text_summary"))) == [1, 2, 3, 4]


def _trackio_attempt(tracker_dir: Path) -> dict[str, Any]:
    """One Trackio attempt in this (fresh) process, and what Trackio's own store then holds."""
    os.environ["TRACKIO_DIR"] = str(tracker_dir / "trackio")
    config = TrackingConfig(report_to=["trackio"], project="tk", tracker_dir=tracker_dir)
    warnings = _attempt(config, "job_tk", range(1, 4), "succeeded")
    from trackio.sqlite_storage import SQLiteStorage

    return {"warnings": list(warnings), "logs": SQLiteStorage.get_logs("tk", "job_tk")}


def test_trackio_local_store_holds_the_curves_and_the_samples(tmp_path: Path) -> None:
    """In a process of its own, as a job's training process is: Trackio reads its directory
    once, at import, and this test process may have imported it already."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        out = pool.submit(_trackio_attempt, tmp_path).result(timeout=120)
    assert out["warnings"] == []
    curves = [(row["step"], row["reward_mean"]) for row in out["logs"] if "reward_mean" in row]
    assert curves == [(1, 0.1), (2, 0.2), (3, 0.3)]
    tables = [row for row in out["logs"] if "samples/train" in row]
    assert [row["step"] for row in tables] == [1, 2, 3]
    first = tables[0]["samples/train"]
    assert first["_type"] == "trackio.table", first
    assert [r["completion"] for r in first["_value"]] == ["0 |x", "1 |x"]
    assert (tmp_path / "trackio" / "tk.db").is_file()


def test_trackio_imported_elsewhere_first_is_one_warning(tmp_path: Path) -> None:
    """A process whose trackio already reads another directory would write where the job
    cannot find it: the tracker refuses, as one warning, and the job goes on."""
    import trackio.utils

    other = tmp_path / "not-trackio's"
    os.environ["TRACKIO_DIR"] = str(other)
    try:
        config = TrackingConfig(report_to=["trackio"], project="tk", tracker_dir=tmp_path)
        warnings = _attempt(config, "job_tk2", range(1, 2), "succeeded")
    finally:
        os.environ.pop("TRACKIO_DIR", None)
    assert warnings == [("trackio", f"RuntimeError: trackio already stores under "
                                    f"{trackio.utils.TRACKIO_DIR}")]  # fmt: skip
    assert not other.exists()


def test_an_unreachable_mlflow_is_one_warning_and_the_others_go_on(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{_closed_port()}"
    logdir = tmp_path / "tb"
    config = TrackingConfig(
        report_to=["mlflow", "tensorboard"], mlflow_tracking_uri=uri, tensorboard_dir=logdir
    )
    warnings = _attempt(config, "job_x", range(1, 3), "succeeded")
    assert len(warnings) == 1 and warnings[0][0] == "mlflow", warnings
    assert "127.0.0.1" in warnings[0][1]
    assert [s for s, _ in scalars(logdir, "reward_mean")] == [1, 2]


def test_a_failing_tracker_warning_never_shows_the_secret(tracker_dir: Path) -> None:
    """W&B online with a key it cannot check (no route to its server): one warning, the key
    blanked out of it, and nothing more from that tracker for the rest of the attempt."""
    key = "k" * 40
    os.environ["WANDB_INIT_TIMEOUT"] = "3"
    try:
        config = TrackingConfig(report_to=["wandb"], wandb_api_key=key, tracker_dir=tracker_dir)
        warnings = Warnings()
        trackers = open_trackers(config, warnings)
        trackers.start("job_online", "n", {"api": key})
        trackers.log_metrics(1, _metrics(1))
        trackers.finish("succeeded")
    finally:
        os.environ.pop("WANDB_INIT_TIMEOUT", None)
    assert [w[0] for w in warnings] == ["wandb"] and trackers.names == []
    assert key not in warnings[0][1]


def test_no_tracker_named_means_nothing_to_do() -> None:
    trackers = Trackers([], Warnings(), [])
    trackers.start("job", "n", SPEC)
    trackers.log_metrics(1, _metrics(1))
    trackers.finish("succeeded")
    assert trackers.names == []
