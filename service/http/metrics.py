"""Prometheus metrics: requests and latencies by route (an ASGI middleware), and, computed at
each scrape, jobs by status and the depth of every queue in use.

The job and queue gauges are the operator's: they show every tenant's activity and the queue
names, so they are in a registry of their own (`OPERATOR_REGISTRY`) that `/metrics` serves
only to a scrape with the operator's token (GRPO_METRICS_TOKEN)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.db import session_scope
from service.models import Job

log = logging.getLogger(__name__)

REQUESTS = Counter("grpo_http_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram(
    "grpo_http_request_seconds",
    "HTTP request latency",
    ["method", "route"],
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
# The children of both metrics by (method, route, status): bounded, as routes are templates.
_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
STATUSES = (
    "queued", "running", "cancelling", "pausing", "paused", "succeeded", "failed", "cancelled",
)  # fmt: skip


class MetricsMiddleware:
    """Counts every request by route template (not raw path: ids would explode the labels)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            method = scope["method"]
            key = (method, route, status)
            children = _children.get(key)
            if children is None:  # `labels()` validates and locks: once per label set is enough
                children = (REQUESTS.labels(method, route, status), LATENCY.labels(method, route))
                _children[key] = children
            children[0].inc()
            children[1].observe(time.perf_counter() - started)


class JobsCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily("grpo_jobs", "Jobs by status (all tenants)", labels=["status"])
        depth = GaugeMetricFamily(
            "grpo_queue_depth", "Messages waiting in a broker queue", labels=["queue"]
        )
        try:
            with session_scope() as s:
                counts = dict(
                    s.execute(select(Job.status, func.count()).group_by(Job.status)).all()
                )
                queues = set(s.scalars(select(Job.queue).where(Job.status == "queued").distinct()))
        except Exception:
            log.warning("metrics: database unreachable", exc_info=True)
            return
        for status in STATUSES:
            jobs.add_metric([status], counts.get(status, 0))
        yield jobs
        from service.worker import queue_depth

        for queue in sorted(queues | {"gpu"}):
            size = queue_depth(queue)
            if size is not None:
                depth.add_metric([queue], size)
        yield depth


# Collected only for an authorised scrape; the default registry holds the request metrics.
OPERATOR_REGISTRY = CollectorRegistry(auto_describe=False)
_registered = False


def register_collectors() -> None:
    global _registered
    if not _registered:
        OPERATOR_REGISTRY.register(JobsCollector())
        _registered = True
