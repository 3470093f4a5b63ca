"""Which job events a webhook announces, and under what `type`."""

from __future__ import annotations

from typing import Any, Literal, get_args

EventType = Literal[
    "job.queued",
    "job.running",
    "job.paused",
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.checkpoint",
    "job.reward_hacking_suspected",
]
ALL = "*"
EVENT_TYPES: frozenset[str] = frozenset(get_args(EventType))
TEST_EVENT = "webhook.test"

# Job event log types announced as they are; `status` events become `job.<status>`.
_PLAIN = {
    "checkpoint": "job.checkpoint",
    "reward_hacking_suspected": "job.reward_hacking_suspected",
}


def webhook_type(event_type: str, data: dict[str, Any]) -> str | None:
    """The webhook `type` of a job event (`status` {queued} -> `job.queued`), or None for the
    events no webhook announces (`cancelling`, `attempt_ended`, pruning notes...)."""
    if event_type == "status":
        name = f"job.{data.get('status')}"
        return name if name in EVENT_TYPES else None
    return _PLAIN.get(event_type)


def subscribed(events: list[str], type_: str) -> bool:
    return ALL in events or type_ in events
