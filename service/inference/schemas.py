"""OpenAI-shaped request bodies of `/v1/chat/completions` and `/v1/completions` (the subset we
serve; an unknown field is a 422 naming it, never silently ignored). `grpo-service serve`
validates with the same classes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

MAX_CHOICES = 16
MAX_STOPS = 4

ModelName = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Stop = Annotated[str, StringConstraints(min_length=1, max_length=200)]
# A string or a list of them, as a list (one type, so an error's path is just `$.stop`)
Stops = Annotated[
    list[Stop],
    BeforeValidator(lambda v: [v] if isinstance(v, str) else v),
    Field(max_length=MAX_STOPS),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = Field(False, description="End the stream with a usage chunk.")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] = Field(description="Text, or text parts.")
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class _Sampling(_Strict):
    model: ModelName = Field(
        description="A catalog model name, or one of your checkpoint ids (`ckpt_…`)."
    )
    temperature: float = Field(1.0, ge=0, le=2, description="0 decodes greedily.")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Only the k most likely tokens (vLLM's extension); 0: all.",
    )
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="Choices per prompt.")
    stop: Stops | None = Field(
        None, description="A string or up to 4; generation ends before the first one."
    )
    seed: int | None = Field(
        None, ge=0, lt=2**63, description="Same seed and body, same completions (best effort)."
    )
    stream: bool = Field(False, description="Server-sent events, ending with `data: [DONE]`.")
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256, description="Accepted, not used.")

    @field_validator("stream_options")
    @classmethod
    def _only_streamed(cls, value: StreamOptions | None, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):
            raise ValueError("only with stream: true")
        return value

    def stops(self) -> list[str]:
        return list(self.stop or [])


class ChatCompletionRequest(_Sampling):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                    "max_completion_tokens": 32,
                    "temperature": 0.7,
                }
            ]
        },
    )

    messages: list[Message] = Field(min_length=1, max_length=1000)
    max_tokens: int | None = Field(None, ge=1, description="Deprecated name of the next.")
    max_completion_tokens: int | None = Field(
        None, ge=1, description="Completion length cap (default: the rest of the context)."
    )
    logprobs: bool = Field(False, description="Return each output token's log-probability.")
    top_logprobs: int | None = Field(
        None, ge=0, le=20, description="Also the k most likely tokens at each position."
    )

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return value

    def token_cap(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def logprob_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"model": "tiny", "prompt": "Once upon a time", "max_tokens": 16}]
        },
    )

    prompt: str | list[str] = Field(description="A prompt, or a few (each gets n choices).")
    max_tokens: int | None = Field(16, ge=1, description="Completion length cap.")
    logprobs: int | None = Field(
        None, ge=0, le=5, description="Each token's log-prob and the k most likely."
    )
    echo: Literal[False] = Field(False, description="Echoing the prompt is not supported.")

    @field_validator("prompt")
    @classmethod
    def _prompt_count(cls, value: str | list[str], info: ValidationInfo) -> str | list[str]:
        count = 1 if isinstance(value, str) else len(value)
        if not 1 <= count * info.data.get("n", 1) <= MAX_CHOICES:
            raise ValueError(f"1 to {MAX_CHOICES} prompts, times n at most {MAX_CHOICES}")
        return value

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)
