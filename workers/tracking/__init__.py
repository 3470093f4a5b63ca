"""Experiment trackers of a training job (MLflow, W&B, TensorBoard, Trackio): worker-only.

Each tracker's package is imported lazily, inside its `start`; nothing here imports the web,
the database or the queue, and the API process never imports this package (import-linter).
"""

from workers.tracking.config import SAMPLE_COLUMNS, TrackingConfig, flatten
from workers.tracking.fanout import Tracker, Trackers, open_trackers

__all__ = ["SAMPLE_COLUMNS", "Tracker", "Trackers", "TrackingConfig", "flatten", "open_trackers"]
