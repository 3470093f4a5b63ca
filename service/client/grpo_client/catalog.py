"""The model catalog: what a job's `base_model` and an inference request's `model` take."""

from __future__ import annotations

from grpo_client.models_generated import ModelOut
from grpo_client.transport import Transport


class Models:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def list(self) -> list[ModelOut]:
        """`GET /v1/models`: the catalog's base models, then your fine-tuned models and your
        checkpoints, newest first (the API lists them whole, unpaged)."""
        body = self._t.json("GET", "/v1/models")
        return [ModelOut.model_validate(m) for m in body["data"]]

    def get(self, model: str) -> ModelOut:
        """`GET /v1/models/{model}`: one of them."""
        return ModelOut.model_validate(self._t.json("GET", f"/v1/models/{model}"))
