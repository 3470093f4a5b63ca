"""NaN, Infinity and NUL in a JSON body are a 422 naming the field on every route that takes a
body, on PostgreSQL, whose json and text refuse them: on the Tinker routes they were 500s (issue
46 item 8). The routes are the app's own, enumerated: a new route is covered without a word. A
NUL in a Tinker id or tinker:// path of the URL reads as a missing one (it was a 500 too)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from service.app import create_app
from service.settings import Settings
from tests.api.helpers import PROBLEM, problem
from tests.e2e.services import RunningService

NUL = "text must not contain NUL characters"
NOT_FINITE = "a number must be finite (NaN and Infinity are not JSON)"
# The bad value sits at $.probe[1].v of `{"probe": [0, {"v": <bad>}]}`; `json=` would refuse
# NaN, so the bodies are written out.
BAD = {
    "nan": ("NaN", "$.probe[1].v", NOT_FINITE),
    "infinity": ("Infinity", "$.probe[1].v", NOT_FINITE),
    "minus-infinity": ("-Infinity", "$.probe[1].v", NOT_FINITE),
    "overflow": ("1e999", "$.probe[1].v", NOT_FINITE),  # read as infinite
    "nul": ('"a\\u0000b"', "$.probe[1].v", NUL),
    "nul-key": ('{"a\\u0000": 1}', "$.probe[1].v", f"a key: {NUL}"),
}
BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def body_routes() -> list[tuple[str, str, bool]]:
    """(method, path, parses its own body) of every route of the app that takes a body."""
    app = create_app(Settings())
    routes = []
    for route in iter_route_contexts(app.routes):
        for method in sorted((route.methods or set()) & BODY_METHODS):
            reads_its_body = getattr(route.endpoint, "reads_its_body", False)
            routes.append((method, re.sub(r"\{[^}]*\}", "x", route.path), reads_its_body))
    return routes


ROUTES = body_routes()


def test_the_routes_are_the_apps() -> None:
    """The enumeration finds the routes (a change in FastAPI's routing would not go unseen)."""
    paths = {path for _, path, _ in ROUTES}
    assert {"/v1/jobs", "/v1/chat/completions", "/api/v1/create_model", "/api/v1/asample"} <= paths
    assert len(ROUTES) > 50


@pytest.fixture(scope="module")
def client(api_pg: RunningService) -> Iterator[httpx.Client]:
    with api_pg.client(api_pg.new_key("unstorable-json")) as c:  # a Bearer key: Tinker's too
        yield c


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize(("method", "path", "reads_its_body"), ROUTES)
def test_a_body_the_stores_cannot_keep_is_a_422_naming_the_field(
    client: httpx.Client, method: str, path: str, reads_its_body: bool, bad: str
) -> None:
    value, where, message = BAD[bad]
    body = '{"probe": [0, {"v": ' + value + "}]}"
    r = client.request(method, path, content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM), r.text
    if not reads_its_body:  # those parse their body strictly as it streams: invalid JSON
        # named first; the body's other faults (fields it lacks) follow
        assert problem(r, 422)["errors"][0] == {"path": where, "message": message}


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ],
)
def test_a_tinker_path_with_nul_on_the_inference_routes_is_a_422(
    client: httpx.Client, endpoint: str, body: dict
) -> None:
    model = "tinker://tks_x:train:0/sampler_weights/a\x00b"
    r = client.post(endpoint, json={"model": model, **body})
    assert problem(r, 422)["errors"] == [{"path": "$.model", "message": NUL}]
    assert r.json()["error"]["param"] == "model"  # as the openai SDK reads it


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/training_runs/a%00b"),
        ("GET", "/api/v1/training_runs/a%00b/checkpoints"),
        ("GET", "/api/v1/training_runs/r/checkpoints/sampler_weights/a%00/archive"),
        ("DELETE", "/api/v1/training_runs/r/checkpoints/weights/a%00"),
        ("GET", "/api/v1/samplers/a%00"),
        ("POST", "/api/v1/sessions/a%00/finish"),
    ],
)
def test_a_nul_in_a_tinker_id_of_the_url_reads_as_missing(
    client: httpx.Client, method: str, path: str
) -> None:
    problem(client.request(method, path), 404)
