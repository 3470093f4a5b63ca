"""Worker observability: Prometheus metrics across the worker's processes, JSON log lines.

Metrics: the supervisor (`grpo-service worker --metrics-port N`) points PROMETHEUS_MULTIPROC_DIR
at a folder before it starts Celery, so the training child (a fresh process per job) records
into shared files and the supervisor serves them all on /metrics (prometheus-client's
multiprocess mode). Logs: every record is one JSON object carrying the job id and epoch of the
run that logged it.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    multiprocess,
    start_http_server,
)

STEPS = Counter("grpo_worker_steps_total", "Training steps completed")
TOKENS = Counter("grpo_worker_completion_tokens_total", "Completion tokens generated")
STEP_SECONDS = Histogram(
    "grpo_worker_step_seconds",
    "Wall time of one training step",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
VERIFIER_ERRORS = Counter(
    "grpo_worker_verifier_errors_total", "Completions a verifier failed to score", ["verifier"]
)
GPU_MEMORY = Gauge(
    "grpo_worker_gpu_memory_bytes", "Peak GPU memory of the running job", multiprocess_mode="max"
)

job_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "job_context", default=None
)


def record_step(metrics: dict[str, float]) -> None:
    """Count one step from the engine's metrics row."""
    STEPS.inc()
    seconds = float(metrics.get("step_seconds", 0.0))
    STEP_SECONDS.observe(seconds)
    TOKENS.inc(float(metrics.get("tokens_per_second", 0.0)) * seconds)
    for key, value in metrics.items():
        if key.startswith("errors/") and value:
            VERIFIER_ERRORS.labels(verifier=key.removeprefix("errors/")).inc(value)
    try:
        import torch

        if torch.cuda.is_available():
            GPU_MEMORY.set(torch.cuda.max_memory_allocated())
    except ImportError:
        pass


def serve_metrics(port: int, host: str = "0.0.0.0") -> str:
    """In the supervisor, before the worker starts: a shared folder and the /metrics server."""
    folder = tempfile.mkdtemp(prefix="grpo-prom-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder  # inherited by Celery and its children
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=folder)
    start_http_server(port, addr=host, registry=registry)
    return folder


def cleanup_metrics(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the job id and epoch."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
            **(job_context.get() or {}),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def use_json_logs(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
