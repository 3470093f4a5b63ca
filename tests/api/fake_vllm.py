"""A stand-in for an operator's vLLM (outside the product): a small FastAPI app over real HTTP
that answers as vLLM's OpenAI-compatible server does and records what it was sent. It serves
its catalog names and the LoRA adapters loaded through `/v1/load_lora_adapter`, reading each
adapter's folder at the path it is given, as vLLM would; a restart forgets the adapters."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

# A body with this temperature is refused in vLLM's older error shape (a top-level message).
REFUSED_TEMPERATURE = 1.75
FAILING_PROMPT = "fail"  # answered 500
BROKEN_STREAM_PROMPT = "break"  # a stream whose second chunk is an error chunk


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


class FakeVllm:
    def __init__(self, port: int, token: str, served: set[str]) -> None:
        self.port, self.token, self.served = port, token, served
        self.calls: list[tuple[str, dict[str, Any]]] = []  # (path, body) of every call
        self.adapters: dict[str, str] = {}  # lora_name -> lora_path
        self.app = self._app()
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def bodies(self, path: str) -> list[dict[str, Any]]:
        return [body for p, body in self.calls if p == path]

    def start(self) -> None:
        """Listening (again, after `stop`: a restarted vLLM, its adapters forgotten)."""
        self.adapters.clear()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the fake vLLM did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        assert self.server is not None and self.thread is not None
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "the fake vLLM did not stop"

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def record(request: Request, call_next: Any) -> Response:
            body = json.loads(await request.body() or b"{}")
            self.calls.append((request.url.path, body))
            if request.headers.get("authorization") != f"Bearer {self.token}":
                return _error(401, "invalid api key", "AuthenticationError")
            return await call_next(request)

        @app.post("/v1/load_lora_adapter")
        async def load(request: Request) -> Response:
            body = await request.json()
            name, path = body["lora_name"], Path(body["lora_path"])
            if name in self.adapters:  # vLLM's answer, word for word
                return JSONResponse(
                    {"object": "error", "type": "InvalidUserInput", "code": 400,
                     "message": f"The lora adapter '{name}' has already been loaded."}, 400,
                )  # fmt: skip
            if not (path / "adapter_config.json").is_file():
                return _error(400, f"No adapter found for {path}", "BadRequestError")
            self.adapters[name] = str(path)
            return Response(f"Success: LoRA adapter '{name}' added successfully.")

        @app.post("/v1/unload_lora_adapter")
        async def unload(request: Request) -> Response:
            name = (await request.json())["lora_name"]
            if self.adapters.pop(name, None) is None:
                return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            return Response(f"Success: LoRA adapter '{name}' removed successfully.")

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return self._complete("chat", await request.json())

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return self._complete("text", await request.json())

        return app

    def _complete(self, kind: str, body: dict[str, Any]) -> Response:
        model = body["model"]
        if model not in self.served and model not in self.adapters:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        if body.get("temperature") == REFUSED_TEMPERATURE:
            return JSONResponse(
                {"object": "error", "type": "BadRequestError", "code": 400, "param": None,
                 "message": "temperature is too high for this model"}, 400,
            )  # fmt: skip
        prompt = body["prompt"] if kind == "text" else body["messages"][-1]["content"]
        if prompt == FAILING_PROMPT:
            return Response("Internal Server Error", 500)
        words = ["the ", "answer ", f"from {model}"]
        if not body.get("stream"):
            text = "".join(words)
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if kind == "chat" else {"index": 0, "text": text}
            )  # fmt: skip
            usage = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
            obj = "chat.completion" if kind == "chat" else "text_completion"
            choice |= {"finish_reason": "length", "logprobs": None}
            return JSONResponse({"id": "cmpl-fake", "object": obj, "created": 1,
                                 "model": model, "choices": [choice], "usage": usage})  # fmt: skip
        return StreamingResponse(
            self._chunks(kind, model, words, prompt), media_type="text/event-stream"
        )

    def _chunks(self, kind: str, model: str, words: list[str], prompt: str) -> Iterator[str]:
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        for i, word in enumerate(words):
            if i == 1 and prompt == BROKEN_STREAM_PROMPT:
                yield "data: " + json.dumps({"error": {"message": "decoding failed",
                                                       "type": "InternalServerError",
                                                       "code": 500}}) + "\n\n"  # fmt: skip
                return
            delta = {"content": word} if kind == "chat" else None
            choice = {"index": 0, "finish_reason": "length" if i == 2 else None}
            choice |= {"delta": delta} if delta else {"text": word}
            chunk = {"id": "cmpl-fake", "object": obj, "created": 1, "model": model,
                     "choices": [choice]}  # fmt: skip
            yield "data: " + json.dumps(chunk) + "\n\n"
        yield "data: [DONE]\n\n"
