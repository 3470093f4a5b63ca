"""What storing rollouts costs a step: the write path's time as a fraction of the step's.

    .venv/bin/python bench/rollout_overhead.py [--steps 3] [--prompts 8] [--group 16]
        [--tokens 256]

Trains the tiny model (`workers/grpo/tiny_model.py`) at the shape of a real job's step (8
prompts x 16 completions, up to 256 tokens each) for `--steps` steps, with a no-op rollouts
hook that keeps each step's rows, and times the training step (`step_seconds`, which leaves
the hook out) and the building of the rows inside it. Then it replays the write path of each
step's rows through the worker's own `RolloutWriter` twice: into local storage and a SQLite
database, and into moto S3 over HTTP (an in-process server) with the same database: Parquet
encode, upload, fenced insert (`lifecycle.record_rollouts`, one transaction). Prints the median
seconds of each and the overhead ratio (rows + write) / step for both stores.
The step of a 200-step job has the same shape every step, so a few steps give the ratio.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.step_phases import timed  # noqa: E402


class LongScorer:
    """Rewards length, so the groups have a spread (advantages non-zero) at no sandbox cost."""

    name, weight = "length", 1.0

    def score(self, samples: list[dict]) -> tuple[list[float | None], list[str | None]]:
        return [len(s["completion"]) / 100 for s in samples], [None] * len(samples)


def train_steps(args: argparse.Namespace, work: Path) -> tuple[list[float], list[float], list]:
    """(step seconds, row-building seconds, the hook's calls) of a short tiny-model run."""
    import workers.grpo.trainer as trainer
    from workers.grpo.config import TrainSpec
    from workers.grpo.tiny_model import make_tiny_model

    model = make_tiny_model(work / "tiny", seed=0)
    building: list[float] = []
    trainer.rollout_rows = timed(building, trainer.rollout_rows)
    calls: list[tuple[int, str, list[dict]]] = []
    metrics: dict[int, dict[str, float]] = {}
    hooks = trainer.TrainHooks(
        on_step=lambda step, m: metrics.__setitem__(step, m),
        on_rollouts=lambda *call: calls.append(call),
    )
    spec = TrainSpec.model_validate({
        "base_model": str(model),
        "grpo": {"steps": args.steps, "prompts_per_step": args.prompts,
                 "group_size": args.group, "learning_rate": 1e-4, "beta": 0.04},
        "generation": {"max_new_tokens": args.tokens},
        "checkpoint_every": 10_000,
    })  # fmt: skip
    records = [{"prompt": f"Question {i}: count to ten."} for i in range(64)]
    trainer.train(spec, records, [LongScorer()], work / "train", hooks)
    steps = [metrics[s]["step_seconds"] for s in sorted(metrics)]
    return steps, building, calls


def write_path(calls: list, storage: Any, db_url: str) -> list[float]:
    """Seconds of RolloutWriter per call: encode, upload, fenced insert (committed)."""
    from sqlalchemy.orm import sessionmaker

    from service.auth.service import get_or_create_tenant
    from service.core.db import make_engine
    from service.core.ids import new_id
    from service.core.migrate import upgrade
    from service.jobs import lifecycle
    from service.models import Dataset, Job
    from service.settings import Settings
    from service.training.rollout_store import RolloutWriter

    upgrade(db_url)
    sessions = sessionmaker(make_engine(db_url), expire_on_commit=False)
    with sessions.begin() as s:
        tenant = get_or_create_tenant(s, f"bench-{new_id('t')}")
        ds = Dataset(id=new_id("ds"), tenant_id=tenant.id, name="d", num_records=1,
                     sha256="0" * 64, object_key="k")  # fmt: skip
        s.add(ds)
        s.flush()
        job = Job(id=new_id("job"), tenant_id=tenant.id, dataset_id=ds.id, spec={},
                  total_steps=len(calls))  # fmt: skip
        s.add(job)
    with sessions.begin() as s:
        epoch = lifecycle.claim(s, job.id, 600)

    def fenced(write: Any, *a: Any) -> Any:
        with sessions.begin() as session:
            return write(session, job.id, epoch, *a)

    writer = RolloutWriter(job.id, tenant.id, epoch, "all", 0, storage, Settings(), fenced,
                           lambda *e: print("event:", e), sessions.begin)  # fmt: skip
    times = []
    for step, split, rows in calls:
        start = time.perf_counter()
        writer(step, split, rows)
        times.append(time.perf_counter() - start)
    return times


def moto_storage() -> tuple[Any, Any]:
    from moto.server import ThreadedMotoServer

    from service.storage.s3 import S3Storage

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = boto3.client(
        "s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip
    storage = S3Storage(client, "bench-rollouts", "objects")
    storage.ensure_bucket()
    return server, storage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    from service.storage import LocalStorage

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        steps, building, calls = train_steps(args, work)
        local = write_path(calls, LocalStorage(work / "objects"), f"sqlite:///{work}/a.db")
        server, s3 = moto_storage()
        try:
            remote = write_path(calls, s3, f"sqlite:///{work}/b.db")
        finally:
            server.stop()
    rows = len(calls[0][2])
    tokens = statistics.mean(r["length"] for _, _, rs in calls for r in rs)
    step, build = statistics.median(steps), statistics.median(building)
    from service.rollouts.format import encode_rows

    size = statistics.median(len(encode_rows(rs)) for _, _, rs in calls)
    print(f"{len(calls)} steps of {rows} completions (mean {tokens:.0f} tokens), "
          f"{size / 1024:.0f} KiB of Parquet a step")  # fmt: skip
    print(f"step {step:.3f} s  rows {build * 1000:.1f} ms")
    for name, times in (("local", local), ("moto S3", remote)):
        write = statistics.median(times)
        print(f"{name:8s} write {write * 1000:.1f} ms  overhead {(build + write) / step:.2%}")


if __name__ == "__main__":
    main()
