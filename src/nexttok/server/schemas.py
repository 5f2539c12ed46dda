"""Request bodies of the OpenAI-compatible routes. Unknown fields and wrong types are refused
(strict: "0.5" is not a number), and every range is part of the schema, so /openapi.json says
exactly what the server accepts."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

MAX_N = 8
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20

TokenId = Annotated[int, Field(ge=0)]
TokenIdKey = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")]
Bias = Annotated[float, Field(ge=-100, le=100)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool = False


class SamplingFields(Strict):
    """Fields both generation routes take (OpenAI's, plus vLLM's top_k / min_p / repetition_penalty)."""

    model: str
    max_tokens: int | None = Field(None, ge=1, description="capped by the context window")
    temperature: float | None = Field(None, ge=0, description="0 = greedy; default 1")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, description="0 or -1 = off")
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=100)
    logit_bias: dict[TokenIdKey, Bias] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class CompletionRequest(SamplingFields):
    prompt: (str | Annotated[list[TokenId], Field(min_length=1)]
             | Annotated[list[str], Field(min_length=1, max_length=MAX_N)])
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description="top alternatives per token")


class ChatRequest(SamplingFields):
    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description="needs logprobs: true")


class TokenizeRequest(Strict):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[dict[str, Any]], Field(min_length=1)] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[TokenId]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape, used for every 4xx and 5xx."""

    error: ErrorBody
