"""TensorBoard: event files in this attempt's work directory (uploaded with the job by the
runner). A resumed attempt starts with `purge_step`, so TensorBoard drops the earlier attempt's
events of the steps redone."""

from __future__ import annotations

import html
from typing import Any

from workers.tracking.config import SAMPLE_COLUMNS, TrackingConfig, numeric, sample_table


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """TensorBoard's text plugin renders Markdown: one row per sample."""
    lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
    for row in sample_table(rows):
        cells = [html.escape(str(c)).replace("|", "\\|").replace("\n", " ") for c in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


class TensorboardTracker:
    name = "tensorboard"

    def __init__(self, config: TrackingConfig) -> None:
        self.config = config
        self.writer: Any = None

    def start(self, job_id: str, name: str, spec: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.config.tensorboard_dir.mkdir(parents=True, exist_ok=True)
        purge = self.config.resume_step + 1 if self.config.resume_step else None
        self.writer = SummaryWriter(str(self.config.tensorboard_dir), purge_step=purge)

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in numeric(metrics).items():
            self.writer.add_scalar(key, value, step)

    def log_samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        self.writer.add_text(f"samples/{split}", markdown_table(rows), step)

    def flush(self) -> None:
        self.writer.flush()

    def finish(self, status: str) -> None:
        self.writer.close()
