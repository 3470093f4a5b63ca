"""A NUL character in a model id is a missing model in a URL, and a 422 naming the field in a
JSON body (as any NUL in a body, issue 46 item 8), never a 500 (issue 34 item 11). PostgreSQL
refuses NUL in any text parameter, so the catalog's lookups answer "no such model" before the
query; on PostgreSQL itself, where the 500 was."""

from __future__ import annotations

import httpx
import pytest

from tests.api.test_judges import score_model
from tests.e2e.services import RunningService

NUL_IDS = ["ckpt_\x00", "ckpt_abc\x00def", "ft:tiny:x:\x00"]


@pytest.fixture(scope="module")
def client(api_pg: RunningService) -> httpx.Client:
    return api_pg.client(api_pg.new_key("nul-ids"))


def test_a_model_path_with_nul_is_404(client: httpx.Client) -> None:
    for path in ("/v1/models/ckpt_%00", "/v1/models/ckpt_ab%00cd", "/v1/models/ft:tiny:x:%00"):
        r = client.get(path)
        assert r.status_code == 404, (path, r.status_code, r.text)


@pytest.mark.parametrize("model", NUL_IDS)
def test_chat_and_completions_with_a_nul_model_are_422(client: httpx.Client, model: str) -> None:
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    for r in (client.post("/v1/chat/completions", json=chat),
              client.post("/v1/completions", json={"model": model, "prompt": "x"})):  # fmt: skip
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == "model"


@pytest.mark.parametrize("model", NUL_IDS)
def test_a_grader_naming_a_nul_model_is_refused_not_a_500(client: httpx.Client, model: str) -> None:
    r = client.post(
        "/v1/fine_tuning/alpha/graders/validate", json={"grader": score_model(model=model)}
    )
    assert r.status_code in (400, 404, 422), r.text
