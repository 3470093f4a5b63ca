"""Validation of dataset records: `{prompt: str | [{role, content}], ...fields}`, line by line."""

from __future__ import annotations

import json
from typing import Any

from service.problems import FieldError

MAX_ERRORS = 50


def record_errors(record: Any, path: str) -> list[FieldError]:
    if not isinstance(record, dict):
        return [FieldError(path=path, message="a record must be a JSON object")]
    prompt = record.get("prompt")
    if prompt is None:
        return [FieldError(path=f"{path}.prompt", message="'prompt' is required")]
    if isinstance(prompt, str):
        return [] if prompt else [FieldError(path=f"{path}.prompt", message="empty prompt")]
    if not isinstance(prompt, list) or not prompt:
        return [
            FieldError(
                path=f"{path}.prompt",
                message="'prompt' must be a string or a non-empty list of {role, content}",
            )
        ]
    errors = []
    for i, message in enumerate(prompt):
        ok = (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        )
        if not ok:
            errors.append(
                FieldError(
                    path=f"{path}.prompt[{i}]", message="a message is {role: str, content: str}"
                )
            )
    return errors


def validate_records(records: list[Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    for i, record in enumerate(records):
        errors += record_errors(record, f"$.records[{i}]")
        if len(errors) >= MAX_ERRORS:
            break
    return errors


def parse_jsonl(
    data: bytes, max_records: int | None = None, max_line_bytes: int | None = None
) -> tuple[list[dict[str, Any]], list[FieldError]]:
    """Parse and validate JSONL; errors name the 1-based line numbers. Blank lines are skipped."""
    records: list[dict[str, Any]] = []
    errors: list[FieldError] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], [FieldError(path="$.file", message=f"not UTF-8: {exc}")]
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        path = f"$.file.line[{lineno}]"
        if max_line_bytes is not None and len(line) > max_line_bytes // 4:
            size = len(line.encode())
            if size > max_line_bytes:
                errors.append(
                    FieldError(
                        path=path,
                        message=f"line {lineno}: {size} bytes; the limit is {max_line_bytes}",
                    )
                )
                continue
        if max_records is not None and len(records) >= max_records:
            errors.append(FieldError(path="$.file", message=f"more than {max_records} records"))
            break
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(FieldError(path=path, message=f"line {lineno}: invalid JSON: {exc.msg}"))
        else:
            line_errors = record_errors(record, path)
            errors += [
                FieldError(path=e.path, message=f"line {lineno}: {e.message}") for e in line_errors
            ]
            records.append(record)
        if len(errors) >= MAX_ERRORS:
            break
    if not records and not errors:
        errors.append(FieldError(path="$.file", message="the file holds no records"))
    return records, errors


def to_jsonl(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
