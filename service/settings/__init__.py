"""Process settings (pydantic-settings): one `Settings` class, composed of one mixin per domain."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from service.settings.api import ApiSettings
from service.settings.evaluations import EvaluationSettings
from service.settings.inference import InferenceSettings
from service.settings.preflight import PreflightSettings
from service.settings.quotas import QuotaSettings
from service.settings.sandbox import SandboxSettings
from service.settings.storage import StorageSettings
from service.settings.tinker import TinkerSettings
from service.settings.trackers import TrackerSettings
from service.settings.webhooks import WebhookSettings
from service.settings.workers import QueueSettings, WorkerSettings

__all__ = ["QueueSettings", "Settings", "environment_settings", "get_settings", "settings_in_force"]


# Every GRPO_* environment variable (docs/configuration.md). A comment, not a docstring: a
# docstring would become the JSON schema's description, which the class never had. Pydantic
# orders fields from the last base to the first: listed backwards, the fields (model_fields,
# the schema, model_dump) run storage first and inference last, as in the old single class.
class Settings(
    TinkerSettings,
    InferenceSettings,
    WebhookSettings,
    TrackerSettings,
    PreflightSettings,
    EvaluationSettings,
    ApiSettings,
    QuotaSettings,
    SandboxSettings,
    WorkerSettings,
    StorageSettings,
    BaseSettings,
):
    model_config = SettingsConfigDict(env_prefix="GRPO_", extra="ignore")

    # Here, not in TrackerSettings: its default lies under the storage domain's data_dir.
    @property
    def tracker_path(self) -> Path:
        return (self.tracker_dir or self.data_dir / "trackers").expanduser().resolve()


_in_force: ContextVar[Settings | None] = ContextVar("grpo_settings_in_force", default=None)


def get_settings() -> Settings:
    """The settings in force: an application's own while it runs (`settings_in_force`, which
    `service.app.create_app` puts around everything the app runs), else the process's."""
    return _in_force.get() or environment_settings()


@lru_cache
def environment_settings() -> Settings:
    """The process's settings, read once from its GRPO_* environment."""
    return Settings()


@contextmanager
def settings_in_force(settings: Settings) -> Iterator[None]:
    """`settings` for `get_settings` in this context and in the threads and tasks it starts
    (context variables follow them), so that one process can host apps of different settings
    (the API tests host a SQLite and a PostgreSQL app in one process). Each such app runs on an
    event loop of its own: what is kept per event loop (the inference scheduler and proxy
    client, the rate limit's Redis client) is made with the settings of its first request."""
    token = _in_force.set(settings)
    try:
        yield
    finally:
        _in_force.reset(token)
