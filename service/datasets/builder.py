"""Uploads turned into canonical JSONL one record at a time.

Parsed JSON costs many times its size in Python objects (a 65 MB body of empty records took
the API to 1.87 GB), so neither upload form is held as a list of records: a JSON body is read
with ijson (`records.item` by item), a JSONL file line by line, and each record is validated
and written out before the next is read. Memory holds the body and the output bytes. Run it
off the event loop: parsing is CPU work.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ijson

from service.core.problems import FieldError
from service.core.text import unstorable_value
from service.datasets import line_index
from service.datasets.records import MAX_ERRORS, from_messages, record_errors

MAX_DEPTH = 64  # nesting of one record: deeper is refused (and json.dumps would recurse)
# What may be a \uD800-\uDFFF escape outside a high-low pair. ijson's C backend reads one as
# "?"; its Python backend keeps it, and then the record's check names it. A false match only
# costs the slower backend, so the pattern may be loose.
_LONE_SURROGATE = re.compile(
    rb"(?:^|[^\\])(?:\\\\)*(?:\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
    rb"|(?<![0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)


@dataclass
class BuiltDataset:
    data: bytearray = field(default_factory=bytearray)
    num_records: int = 0
    chat: bool = False  # any prompt is chat messages
    line_starts: list[int] = field(default_factory=list)  # of every EVERY-th line (line_index)
    lines: int = 0  # written to `data`
    errors: list[FieldError] = field(default_factory=list)


class DatasetBuilder:
    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self.built = BuiltDataset()

    @property
    def done(self) -> bool:
        """Enough errors to report, or past the record limit: stop reading."""
        return len(self.built.errors) >= MAX_ERRORS or self.built.num_records > self.max_records

    def add(self, record: Any, path: str, line: int | None = None) -> None:
        built = self.built
        built.num_records += 1
        if built.num_records > self.max_records:
            where = "$.file" if line is not None else "$.records"
            built.errors.append(
                FieldError(path=where, message=f"more than {self.max_records} records")
            )
            return
        problems = _shape_errors(record, path)
        if not problems:
            record, problems = from_messages(record, path)
        problems = problems or record_errors(record, path)
        if not problems and (error := unstorable_value(record, path)) is not None:
            problems = [error]
        if problems:
            prefix = f"line {line}: " if line is not None else ""
            built.errors += [FieldError(path=e.path, message=prefix + e.message) for e in problems]
            return
        built.chat = built.chat or isinstance(record.get("prompt"), list)
        if built.lines % line_index.EVERY == 0:
            built.line_starts.append(len(built.data))
        built.data += json.dumps(record, ensure_ascii=False).encode() + b"\n"
        built.lines += 1


def _shape_errors(record: Any, path: str) -> list[FieldError]:
    stack, deepest = [(record, 1)], 1
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return [FieldError(path=path, message=f"nested more than {MAX_DEPTH} levels deep")]
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return []


def _parser_for(data: bytes) -> Any:
    # memchr-fast finds first: the regex holds the GIL, so it only scans bodies that have such
    # an escape at all
    maybe = b"\\ud" in data or b"\\uD" in data
    return ijson.get_backend("python") if maybe and _LONE_SURROGATE.search(data) else ijson


# A line's JSON value -> the record to store, or the line's errors (paths under the line's).
LineConverter = Callable[[Any, str], tuple[Any, list[FieldError]]]


def from_jsonl(
    data: bytes, max_records: int, max_line_bytes: int, convert: LineConverter | None = None
) -> BuiltDataset:
    """Errors name the 1-based line numbers; blank lines are skipped. `convert` turns another
    line format into records first (OpenAI's `{messages, ...}`: `service.files.lines`)."""
    builder = DatasetBuilder(max_records)
    built = builder.built
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        built.errors.append(FieldError(path="$.file", message=f"not UTF-8: {exc}"))
        return built
    for lineno, line in enumerate(text.splitlines(), start=1):
        if builder.done:
            break
        if not line.strip():
            continue
        path = f"$.file.line[{lineno}]"
        if len(line) > max_line_bytes // 4 and (size := len(line.encode())) > max_line_bytes:
            message = f"line {lineno}: {size} bytes; the limit is {max_line_bytes}"
            built.errors.append(FieldError(path=path, message=message))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            message = f"line {lineno}: invalid JSON: {exc.msg}"
            built.errors.append(FieldError(path=path, message=message))
            continue
        except RecursionError:
            message = f"line {lineno}: nested more than {MAX_DEPTH} levels deep"
            built.errors.append(FieldError(path=path, message=message))
            continue
        if convert is not None:
            record, problems = convert(record, path)
            if problems:
                built.num_records += 1
                built.errors += [
                    FieldError(path=e.path, message=f"line {lineno}: {e.message}") for e in problems
                ]
                continue
        builder.add(record, path, lineno)
    if not built.num_records and not built.errors:
        built.errors.append(FieldError(path="$.file", message="the file holds no records"))
    return built


def from_json_body(data: bytes, max_records: int) -> tuple[str | None, BuiltDataset]:
    """`{name, records: [...]}`; the records are read one by one, never all at once."""
    name, built = _envelope(data)
    if built.errors:
        return name, built
    builder = DatasetBuilder(max_records)
    parser = _parser_for(data)
    try:
        for i, record in enumerate(parser.items(io.BytesIO(data), "records.item", use_float=True)):
            builder.add(record, f"$.records[{i}]")
            if builder.done:
                break
    except ijson.JSONError as exc:
        builder.built.errors.append(FieldError(path="$", message=f"invalid JSON: {exc}"))
    if not builder.built.num_records and not builder.built.errors:
        builder.built.errors.append(FieldError(path="$.records", message="at least one record"))
    return name, builder.built


def _envelope(data: bytes) -> tuple[str | None, BuiltDataset]:
    """The top level, read as bare events (nothing is built, and no prefix strings: ijson's
    prefixed events cost memory quadratic in the nesting): the name, no other keys, and no
    nesting past a record's MAX_DEPTH."""
    built, name, keys = BuiltDataset(), None, set()
    depth, key = 0, None  # key: the top-level key whose value comes next
    try:
        for event, value in _parser_for(data).basic_parse(io.BytesIO(data), use_float=True):
            opens = event in ("start_map", "start_array")
            if depth == 0 and event != "start_map":
                built.errors.append(FieldError(path="$", message="the body must be an object"))
                return None, built
            if depth == 1 and event == "map_key":
                key = value
                keys.add(value)
            elif depth == 1:  # the start of `key`'s value (or the body's end)
                if key == "name":
                    name = value if event == "string" else ""
                elif key == "records" and event != "start_array":
                    built.errors.append(FieldError(path="$.records", message="must be a list"))
                    return name, built
                key = None
            if opens:
                depth += 1
                if depth > MAX_DEPTH + 2:  # the body, the records list, then the record
                    message = f"nested more than {MAX_DEPTH} levels deep"
                    built.errors.append(FieldError(path="$.records", message=message))
                    return name, built
            elif event in ("end_map", "end_array"):
                depth -= 1
    except ijson.JSONError as exc:
        built.errors.append(FieldError(path="$", message=f"invalid JSON: {exc}"))
        return None, built
    for extra in sorted(keys - {"name", "records"}):
        built.errors.append(FieldError(path=f"$.{extra}", message="Extra inputs are not permitted"))
    if "records" not in keys:
        built.errors.append(FieldError(path="$.records", message="Field required"))
    if not isinstance(name, str) or not 1 <= len(name) <= 200:
        built.errors.append(FieldError(path="$.name", message="a string of 1 to 200 characters"))
    elif (error := unstorable_value(name, "$.name")) is not None:
        built.errors.append(error)
    return name, built
