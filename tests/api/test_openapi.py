"""The served OpenAPI document: valid 3.1, complete, and true (Schemathesis fuzzes it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate

from tests.api.conftest import served_over_http
from tests.e2e.services import RunningService

api = served_over_http()  # schemathesis calls over HTTP


PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


@pytest.fixture(scope="module")
def document(api: RunningService) -> dict[str, Any]:
    return httpx.get(f"{api.base_url}/openapi.json").json()


def test_document_is_valid_openapi_31(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1")
    validate(document)


def test_every_v1_operation_documents_its_problems(document: dict[str, Any]) -> None:
    for path, item in document["paths"].items():
        if not path.startswith("/v1"):
            continue
        for method, op in item.items():
            codes = set(op["responses"])
            assert {"401", "422"} <= codes, (method, path)
            if "{" in path:
                assert "404" in codes, (method, path)
            if method == "post" and op["responses"].get("201"):
                assert {"409", "413"} <= codes, (method, path)
                names = {p["name"] for p in op.get("parameters", [])}
                assert "Idempotency-Key" in names, (method, path)
            for code, response in op["responses"].items():
                if int(code) >= 400:
                    content = response["content"]
                    assert content == {"application/problem+json": {"schema": PROBLEM_REF}}
            assert op.get("security"), (method, path)
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                ref = body["schema"].get("$ref", "").rsplit("/", 1)[-1]
                schema = document["components"]["schemas"].get(ref, body["schema"])
                assert schema.get("examples"), (method, path)
    assert document["paths"]["/v1/jobs"]["post"]["responses"]["429"]["headers"]["Retry-After"]


SCHEMATHESIS_CONFIG = """
[checks]
enabled = false
not_a_server_error.enabled = true
status_code_conformance.enabled = true
content_type_conformance.enabled = true
response_schema_conformance.enabled = true

# This API has no inference backend: the completion routes answer their documented 503.
[[operations]]
include-path-regex = "^/v1/(chat/)?completions$"
checks.not_a_server_error.enabled = false
"""


def test_schemathesis_fuzzes_every_route(api: RunningService, tmp_path: Path) -> None:
    """Every route, authenticated: no 5xx, and every response as documented (status, content
    type, schema). Bounded: ten examples per operation, under a minute in all on an idle
    machine. The checks are in a config file: a `--checks` flag would override the
    per-operation settings."""
    key = api.new_key("schemathesis")
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    cmd = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file",
        str(config),
        "run",
        f"{api.base_url}/openapi.json",
        "--header",
        f"Authorization: Bearer {key}",
        "--max-examples",
        "10",
        "--phases",
        "examples,coverage,fuzzing",
        "--seed",
        "1",
        "--request-timeout",
        "30",
        "--generation-database",
        ":memory:",
        "--no-color",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-12000:] + out.stderr[-3000:]
