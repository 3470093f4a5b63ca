"""Process settings (pydantic-settings): one `Settings` class, composed of one mixin per domain."""

from __future__ import annotations

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

__all__ = ["QueueSettings", "Settings", "get_settings"]


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


@lru_cache
def get_settings() -> Settings:
    return Settings()
