"""The record fields a grader's templates read (`{{item.answer}}`), checked against the files
at creation: a file missing one is a 400 naming the line, not a job that scores every
completion 0. A python grader reads `item` in code, so nothing of it can be checked here."""

from __future__ import annotations

import json
from typing import Any

from service.core.problems import FieldError
from service.models import Dataset
from service.storage import ObjectStorage
from workers.verifiers.grader_templates import parse_template

MAX_REPORTED_LINES = 5


def item_fields(grader: dict[str, Any], path: str) -> list[tuple[str, str]]:
    """(JSON path of the template, top-level record field) for each `{{item.x…}}` hole of a
    validated grader."""
    found = []
    if grader.get("type") == "multi":
        for key, sub in grader.get("graders", {}).items():
            found += item_fields(sub, f"{path}.graders.{key}")
        return found
    for name in ("input", "reference"):
        text = grader.get(name)
        if isinstance(text, str):
            for hole in parse_template(text).paths:
                if hole[0] == "item":
                    found.append((f"{path}.{name}", hole[1]))
    return found


def missing_fields(
    fields: list[tuple[str, str]], dataset: Dataset, file_field: str, storage: ObjectStorage
) -> list[FieldError]:
    """A 400's errors: per field the grader reads, the first lines of the file without it."""
    if not fields:
        return []
    lacking: dict[str, list[int]] = {}
    wanted = {name for _, name in fields}
    for lineno, line in enumerate(storage.get_bytes(dataset.object_key).splitlines(), start=1):
        record = json.loads(line)
        for name in wanted - record.keys():
            lacking.setdefault(name, []).append(lineno)
    errors = []
    for template_path, name in fields:
        if name in lacking:
            numbers = lacking[name]
            shown = ", ".join(map(str, numbers[:MAX_REPORTED_LINES]))
            more = f" and {len(numbers) - MAX_REPORTED_LINES} more" if len(numbers) > 5 else ""
            hint = " (the messages are the prompt, not an item field)" if name == "messages" else ""
            records = "record" if len(numbers) == 1 else "records"
            message = (
                f"reads {{{{item.{name}}}}}, which {records} {shown}{more} of {file_field} "
                f"lack{'s' if len(numbers) == 1 else ''}{hint}"
            )
            errors.append(FieldError(path=template_path, message=message))
    return errors
