"""Requests in from any thread, batches out on one: the engine thread waits for a request,
collects whatever else arrives within `window_s` (up to `max_rows` choices), then decodes the
requests of each model together (one forward per token for the whole group). Requests that
arrive meanwhile wait for the next batch: a static batch, not continuous batching. A request
cancelled (`Request.cancel`, its client gone) leaves the batch at its next token.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from workers.inference.decode import CANCELLED, decode, prompt_ids
from workers.inference.params import Cancelled, ModelRef, Request
from workers.inference.pool import ModelPool

log = logging.getLogger(__name__)


@dataclass
class EngineStats:
    batches: int = 0
    requests: int = 0
    rows: int = 0
    max_batch_rows: int = 0
    tokens: int = 0  # completion tokens decoded, cancelled requests' included
    cancelled: int = 0  # requests cancelled (their client went away) before their end


class Engine:
    def __init__(self, pool: ModelPool, window_s: float = 0.005, max_rows: int = 16) -> None:
        self.pool, self.window_s, self.max_rows = pool, window_s, max_rows
        self.stats = EngineStats()
        self._queue: queue.Queue[Request | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="inference-engine", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> None:
        self._queue.put(request)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _collect(self, first: Request) -> tuple[list[Request], bool]:
        batch, rows = [first], first.n
        deadline = time.monotonic() + self.window_s
        while rows < self.max_rows:
            left = deadline - time.monotonic()
            try:
                nxt = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                return batch, True
            batch.append(nxt)
            rows += nxt.n
        return batch, False

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = self._collect(first)
            by_model: dict[ModelRef, list[Request]] = defaultdict(list)
            for req in batch:
                if req.cancelled:  # gone while it waited: never decoded
                    self._cancelled(req)
                else:
                    by_model[req.model].append(req)
            for ref, requests in by_model.items():
                self._serve(ref, requests)

    def _serve(self, ref: ModelRef, requests: list[Request]) -> None:
        """Decode one model's requests in chunks of at most `max_rows` choices."""
        try:
            with self.pool.use(ref) as (model, tokenizer):
                ready = []
                for req in requests:
                    try:
                        ready.append((req, prompt_ids(model, tokenizer, req)))
                    except Exception as exc:  # noqa: BLE001 - this request's own fault
                        req.on_error(exc)
                for chunk in _chunks(ready, self.max_rows):
                    self._decode(model, tokenizer, chunk)
        except Exception as exc:  # noqa: BLE001 - the model would not load: every request fails
            log.warning("cannot serve %s: %s", ref.label, exc)
            for req in requests:
                req.on_error(exc)

    def _decode(self, model: Any, tokenizer: Any, chunk: list[tuple[Request, list[int]]]) -> None:
        requests = [req for req, _ in chunk]
        try:
            results = decode(model, tokenizer, requests, [ids for _, ids in chunk])
        except Exception as exc:  # noqa: BLE001 - reported to every caller, the engine goes on
            log.exception("decoding a batch failed")
            for req in requests:
                req.on_error(exc)
            return
        rows = sum(r.n for r in requests)
        self.stats.batches += 1
        self.stats.requests += len(requests)
        self.stats.rows += rows
        self.stats.max_batch_rows = max(self.stats.max_batch_rows, rows)
        self.stats.tokens += sum(r.completion_tokens for r in results)
        for req, result in zip(requests, results, strict=True):
            if any(c.finish_reason == CANCELLED for c in result.choices):
                self._cancelled(req)
            else:
                req.on_done(result)

    def _cancelled(self, req: Request) -> None:
        self.stats.cancelled += 1
        req.on_error(Cancelled("the request was cancelled"))


def _chunks(
    items: list[tuple[Request, list[int]]], max_rows: int
) -> list[list[tuple[Request, list[int]]]]:
    out: list[list[tuple[Request, list[int]]]] = [[]]
    rows = 0
    for item in items:
        if out[-1] and rows + item[0].n > max_rows:
            out.append([])
            rows = 0
        out[-1].append(item)
        rows += item[0].n
    return [c for c in out if c]
