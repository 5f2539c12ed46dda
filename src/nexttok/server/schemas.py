"""Request bodies of the OpenAI-compatible routes. Unknown fields and wrong types are refused
(strict: "0.5" is not a number), and every range is part of the schema, so /openapi.json says
exactly what the server accepts. The sampling fields are the sampler stages' settings
(nexttok.generation.stages), under llama-server's names, each with its stage's range and meaning."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

from nexttok.generation.parameters import OPENAI_STOP_STRINGS, PARAMETERS
from nexttok.generation.stages import SETTINGS, Bound, Strings

MAX_N = 8
MAX_PROMPTS = 64  # prompts in one completions request (evaluation harnesses send batches)
MAX_TOP_LOGPROBS = 20

TokenId = Annotated[int, Field(ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
TokenIdKey = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")]
Bias = Annotated[float, Field(**PARAMETERS["logit_bias"].limits())]
# stop strings as OpenAI bounds them (parameters.OPENAI_STOP_STRINGS): `stop` here, Anthropic's stop_sequences
StopString = Annotated[str, StringConstraints(min_length=1, max_length=OPENAI_STOP_STRINGS.length)]
StopStrings = Annotated[list[StopString], Field(max_length=OPENAI_STOP_STRINGS.count)]


def bounded(name: str, default: Any = None, **overrides: Any) -> Any:
    """A request field with the library's range and meaning of a sampling parameter (one table:
    nexttok.generation.parameters.PARAMETERS): bounded("top_p") is Field(None, gt=0.0, le=1.0, description=...)."""
    bound = PARAMETERS[name]
    return Field(default, **{**bound.limits(), "description": bound.meaning, **overrides})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def stage_field(name: str, default: Any = None) -> tuple[Any, Any]:
    """(annotation, Field) of a stage setting as a request field: a number with its bound, a list of
    strings with its limits, or logit_bias (token ids as JSON's string keys)."""
    setting = SETTINGS[name]
    if isinstance(setting, Bound):
        return setting.annotation | None, bounded(name, default)
    if isinstance(setting, Strings):
        item = Annotated[str, StringConstraints(min_length=1, max_length=setting.max_length)]
        return list[item] | None, Field(default, max_length=setting.max_items, description=setting.meaning)
    return dict[TokenIdKey, Bias] | None, Field(default, description=setting.meaning)


_OVERRIDES = {"top_k": (int | None, bounded("top_k", ge=PARAMETERS["top_k"].low - 1,  # vLLM's -1, taken as 0
                                             description="keep the k most likely tokens; 0 or -1 = off"))}

StageFields = create_model("StageFields", __base__=Strict, __doc__="Every sampler stage's settings.",
                           **{name: _OVERRIDES.get(name) or stage_field(name) for name in SETTINGS})


def stage_settings(body: BaseModel) -> dict[str, Any]:
    """The stage settings a request gives, as SamplingParams takes them (one left out takes its
    default): stage_settings(body with top_k=-1, logit_bias={"5": 1.0}) == {"top_k": 0, "logit_bias": {5: 1.0}}."""
    given = {name: SETTINGS[name].from_json(getattr(body, name)) for name in SETTINGS
             if getattr(body, name, None) is not None}
    if given.get("top_k") == -1:  # vLLM's "off"
        given["top_k"] = 0
    return given


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


class NexttokOptions(Strict):
    """nexttok's own request options, apart from OpenAI's fields."""

    trace: bool = Field(False, description="return each choice's trace (the lines of a `nexttok run --trace` "
                                           "file) as `trace`, or as the last event of a stream")


class SamplingFields(StageFields):
    """Fields both generation routes take: OpenAI's, vLLM's top_k / min_p / repetition_penalty, and
    llama-server's for the other stages (StageFields: every stage's settings)."""

    model: str
    max_tokens: int | None = Field(None, ge=1, description="capped by the context window")
    seed: int | None = bounded("seed")
    stop: StopString | StopStrings | None = Field(None, description=OPENAI_STOP_STRINGS.allowed())
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, description="accepted, ignored")
    response_format: OutputFormat | None = None
    nexttok: NexttokOptions | None = Field(None, description='nexttok\'s own options: {"trace": true}')


class CompletionRequest(SamplingFields):
    prompt: (str | TokenIds | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
             | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)])
    max_tokens: int | None = Field(None, ge=0, description="0: score the prompt only (with echo and logprobs)")
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description="top alternatives per token")
    echo: bool = Field(False, description="the prompt comes back before the completion (with logprobs: "
                                          "the prompt's own logprobs, the first token's null)")
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS,
                                        description="vLLM's: each prompt token's logprob, rank and top alternatives")
    suffix: str | None = Field(None, description="text after the completion: fill-in-the-middle, on models "
                                                 "with FIM tokens")
    best_of: int | None = Field(None, ge=1, le=MAX_N, description="choices generated per prompt; the n with "
                                                                  "the highest mean logprob are returned")


class ChatRequest(SamplingFields):
    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]
    tools: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=64)] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = Field(None, description="more than one call per reply; default false")
    functions: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=64)] | None = Field(
        None, description="deprecated form of tools: answered with message.function_call")
    function_call: Literal["auto", "none"] | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description="needs logprobs: true")
    modalities: list[Literal["text", "audio"]] | None = Field(None, description='only ["text"] here')
    audio: dict[str, Any] | None = Field(None, description="refused: this server answers with text")
    # OpenAI fields that change nothing here; accepted so that SDKs that send them work unchanged
    metadata: dict[str, str] | None = Field(None, description="accepted, not stored")
    store: bool | None = Field(None, description="accepted; nothing is stored")
    service_tier: str | None = Field(None, description="accepted; one tier here")
    reasoning_effort: str | None = Field(None, description="accepted; the models here do not reason apart")
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description="accepted, no effect")
    prediction: dict[str, Any] | None = Field(None, description="accepted, not used for drafting")
    safety_identifier: str | None = Field(None, description="accepted, ignored")
    prompt_cache_key: str | None = Field(None, description="accepted; the prefix cache matches by tokens")
    prompt_cache_retention: str | None = Field(None, description="accepted; see --prefix-cache")
    prompt_cache_options: dict[str, Any] | None = Field(None, description="accepted, ignored")
    moderation: dict[str, Any] | None = Field(None, description="accepted; no moderation here")
    web_search_options: dict[str, Any] | None = Field(None, description="accepted; no web search here")


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
