"""OpenAI-shaped ids of our own objects, and back: the same object under OpenAI's prefix.

`file-X` is dataset `ds_X`, `ftjob-X` job `job_X`, `ftckpt-X` checkpoint `ckpt_X`, and
`ftevent-N` job event N. No second id is stored: the view is a renaming, and an id that is not
of the right shape maps onto none (a 404 like any missing id).
"""

from __future__ import annotations

_PREFIXES = {"file": ("file-", "ds_"), "job": ("ftjob-", "job_"), "ckpt": ("ftckpt-", "ckpt_")}


def to_openai(kind: str, our_id: str) -> str:
    theirs, ours = _PREFIXES[kind]
    return theirs + our_id.removeprefix(ours)


def to_ours(kind: str, openai_id: str) -> str | None:
    """Our id for an OpenAI-shaped one; None when it has not that kind's prefix."""
    theirs, ours = _PREFIXES[kind]
    if not openai_id.startswith(theirs) or len(openai_id) == len(theirs):
        return None
    return ours + openai_id[len(theirs) :]


def event_id(our_id: int) -> str:
    return f"ftevent-{our_id}"


def event_number(openai_id: str) -> int | None:
    number = openai_id.removeprefix("ftevent-")
    return int(number) if number != openai_id and number.isdigit() and len(number) < 19 else None
