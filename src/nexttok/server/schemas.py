"""Request bodies of the OpenAI-compatible routes. Unknown fields and wrong types are refused
(strict: "0.5" is not a number), and every range is part of the schema, so /openapi.json says
exactly what the server accepts."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from nexttok.parameters import PARAMETERS

MAX_N = 8
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20

TokenId = Annotated[int, Field(ge=0)]
TokenIdKey = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")]
Bias = Annotated[float, Field(**PARAMETERS["logit_bias"].limits())]


def bounded(name: str, default: Any = None, **overrides: Any) -> Any:
    """A request field with the library's range and meaning of a sampling parameter (one table:
    nexttok.parameters.PARAMETERS): bounded("top_p") is Field(None, gt=0.0, le=1.0, description=...)."""
    bound = PARAMETERS[name]
    return Field(default, **{**bound.limits(), "description": bound.meaning, **overrides})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool = False


class JsonSchemaFormat(Strict):
    """OpenAI's response_format.json_schema: a named schema the output must validate against."""

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    description: str | None = None
    strict: bool | None = None


class OutputFormat(Strict):
    """response_format: "text" (free), "json_object" (any JSON object), "json_schema" (this schema)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(Strict):
    """Fields both generation routes take (OpenAI's, plus vLLM's top_k / min_p / repetition_penalty)."""

    model: str
    max_tokens: int | None = Field(None, ge=1, description="capped by the context window")
    temperature: float | None = bounded("temperature")
    top_p: float | None = bounded("top_p")
    top_k: int | None = bounded("top_k", ge=PARAMETERS["top_k"].low - 1,  # vLLM's -1, taken as 0
                                description="keep the k most likely tokens; 0 or -1 = off")
    min_p: float | None = bounded("min_p")
    presence_penalty: float | None = bounded("presence_penalty")
    frequency_penalty: float | None = bounded("frequency_penalty")
    repetition_penalty: float | None = bounded("repetition_penalty")
    logit_bias: dict[TokenIdKey, Bias] | None = None
    seed: int | None = bounded("seed")
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: OutputFormat | None = None


class CompletionRequest(SamplingFields):
    prompt: (str | Annotated[list[TokenId], Field(min_length=1)]
             | Annotated[list[str], Field(min_length=1, max_length=MAX_N)])
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description="top alternatives per token")


class ChatRequest(SamplingFields):
    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]
    tools: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=64)] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
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
