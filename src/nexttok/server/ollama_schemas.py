"""Request bodies of Ollama's native API (server/ollama.py), every field Ollama's api/types.go
defines for these routes: a field or option outside them is a 400 naming it, and so is a wrong type
(strict: "0.5" is not a number). What each field and option does here is in its description (and
the README's table); the sampling options take their ranges from the one table,
nexttok.generation.parameters.PARAMETERS.

There are no unions of types here (a field that takes a boolean or a string checks itself), so a
validation error's location names the field alone: options.temperature, messages[0].role.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, StringConstraints

from nexttok.generation.parameters import STOP_STRINGS_BOUND
from nexttok.server.schemas import MAX_TOP_LOGPROBS, Strict, bounded

MAX_OLLAMA_STOP = STOP_STRINGS_BOUND.count  # Ollama sets no limit; the engine's (parameters.py)
THINK_LEVELS = ("high", "medium", "low", "max")
LOAD_TIME = "accepted, ignored: a load-time setting, fixed when `nexttok serve` starts"

NonEmpty = Annotated[str, StringConstraints(min_length=1)]


def _format(value: Any) -> Any:
    """format: "" (free text), "json" (any JSON object) or a JSON schema (an object)."""
    if value is None or value in ("", "json") or isinstance(value, dict):
        return value
    raise ValueError('format must be "json" or a JSON schema (an object)')


def _think(value: Any) -> Any:
    if value is None or isinstance(value, bool) or value in THINK_LEVELS:
        return value
    raise ValueError(f"think must be true, false or one of {', '.join(THINK_LEVELS)}")


def _keep_alive(value: Any) -> Any:
    """A duration: seconds as a number, or Go's text ("5m", "1h30m", "-1")."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)) or isinstance(value, str):
        return value
    raise ValueError('keep_alive must be a number of seconds or a duration such as "5m"')


def _input(value: Any) -> Any:
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return value
    raise ValueError("input must be a string or a list of strings")


Format = Annotated[Any, AfterValidator(_format), Field(description='"json" (any JSON object) or a JSON schema: '
                                                       "the grammar stage holds the output to it")]
Think = Annotated[Any, AfterValidator(_think), Field(description="false only: no model here has a thinking "
                                                     "mode (true or a level is a 400)")]
KeepAlive = Annotated[Any, AfterValidator(_keep_alive), Field(description="how long the model stays loaded once "
                                                              "idle: seconds or a duration (\"5m\"); negative: "
                                                              "forever; 0: unloaded now; default the server's "
                                                              "--keep-alive (a model the server started with stays)")]


class OllamaOptions(Strict):
    """Ollama's `options` (its Modelfile parameters), each honoured, refused unless off, or ignored."""

    num_predict: int | None = Field(None, ge=-2, description="tokens to generate at most; -1, -2 or 0: until "
                                    "a stop or the context window is full")
    num_ctx: int | None = Field(None, ge=2, description="this request's context window (prompt + output), "
                                "capped by the server's; a prompt that does not fit is a 400")
    temperature: float | None = bounded("temperature", description="default 0.8 (Ollama's)")
    top_k: int | None = bounded("top_k", description="default 40 (Ollama's); 0 = off")
    top_p: float | None = bounded("top_p", description="default 0.9 (Ollama's)")
    min_p: float | None = bounded("min_p")
    repeat_penalty: float | None = bounded("repetition_penalty", description="HF/CTRL repetition penalty over "
                                           "the whole context (prompt and output)")
    repeat_last_n: int | None = bounded("repeat_last_n", description="the last n tokens the penalties see; -1: the "
                                        "whole context, 0: penalties off (Ollama's default 64 applies only with "
                                        "repeat_penalty, which is off unless sent)")
    presence_penalty: float | None = bounded("presence_penalty", description="OpenAI's: on generated tokens")
    frequency_penalty: float | None = bounded("frequency_penalty", description="OpenAI's: on generated tokens")
    seed: int | None = Field(None, lt=2**63, description="same seed, same draws; negative: a fresh one")
    stop: Annotated[list[NonEmpty], Field(max_length=MAX_OLLAMA_STOP)] | None = Field(
        None, description="text that ends the output (not included)")
    typical_p: float | None = bounded("typical_p")
    tfs_z: float | None = Field(None, description="1 (off) only: tail-free sampling is a 400")
    mirostat: int | None = bounded("mirostat")
    mirostat_tau: float | None = bounded("mirostat_tau")
    mirostat_eta: float | None = bounded("mirostat_eta")
    penalize_newline: bool | None = Field(None, description="accepted, ignored (as Ollama now does)")
    num_keep: int | None = Field(None, description="accepted, ignored: no context shift here (the output ends "
                                 "at the context window)")
    numa: bool | None = Field(None, description=LOAD_TIME)
    num_batch: int | None = Field(None, description=LOAD_TIME)
    num_gpu: int | None = Field(None, description=LOAD_TIME)
    main_gpu: int | None = Field(None, description=LOAD_TIME)
    low_vram: bool | None = Field(None, description=LOAD_TIME)
    f16_kv: bool | None = Field(None, description=LOAD_TIME)
    logits_all: bool | None = Field(None, description=LOAD_TIME)
    vocab_only: bool | None = Field(None, description=LOAD_TIME)
    use_mmap: bool | None = Field(None, description=LOAD_TIME)
    use_mlock: bool | None = Field(None, description=LOAD_TIME)
    embedding_only: bool | None = Field(None, description=LOAD_TIME)
    num_thread: int | None = Field(None, description=LOAD_TIME)
    draft_num_predict: int | None = Field(None, description=LOAD_TIME)


class OllamaFunctionCall(Strict):
    index: int | None = None
    name: NonEmpty
    arguments: dict[str, Any] = Field(default_factory=dict)


class OllamaToolCall(Strict):
    id: str | None = None
    function: OllamaFunctionCall


class OllamaMessage(Strict):
    role: str = Field(description="system, user, assistant or tool")
    content: str | None = None
    thinking: str | None = Field(None, description="an assistant's past reasoning, handed to the chat template")
    images: list[str] | None = Field(None, description="refused: the models here read text only")
    tool_calls: list[OllamaToolCall] | None = Field(None, description="an assistant's past calls")
    tool_name: str | None = Field(None, description="a tool result's tool")
    tool_call_id: str | None = None


class _Generating(Strict):
    """Fields /api/chat and /api/generate share."""

    model: NonEmpty
    stream: bool = Field(True, description="NDJSON, one object a line (the default); false: one object")
    format: Format = None
    options: OllamaOptions | None = None
    keep_alive: KeepAlive = None
    think: Think = None
    truncate: bool | None = Field(None, description="false only: nexttok never drops part of a prompt (one "
                                  "longer than the context window is a 400)")
    shift: bool | None = Field(None, description="false only: no context shift (the output ends at the context "
                               "window, done_reason length)")
    logprobs: bool | None = Field(None, description="each token's logprob in `logprobs`")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description="alternatives per token "
                                     "(with logprobs)")


class OllamaChatRequest(_Generating):
    messages: list[OllamaMessage] | None = Field(None, description="none or []: the model is loaded "
                                                 "(done_reason load)")
    tools: Annotated[list[dict[str, Any]], Field(max_length=64)] | None = Field(
        None, description="OpenAI-style functions; a call comes back as message.tool_calls")


class OllamaGenerateRequest(_Generating):
    prompt: str | None = Field(None, description="none or empty: the model is loaded (done_reason load)")
    suffix: str | None = Field(None, description="fill-in-the-middle, on models with FIM tokens")
    system: str | None = Field(None, description="a system message before the prompt (not with raw)")
    template: str | None = Field(None, description="refused unless empty: Go templates do not run here; the "
                                 "model's own chat template does (raw: true for none)")
    context: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="deprecated: token ids a previous reply returned as `context`, put before the prompt")
    raw: bool | None = Field(None, description="the prompt as is, no chat template")
    images: list[str] | None = Field(None, description="refused: the models here read text only")
    width: int | None = Field(None, description="refused: image generation (experimental in Ollama) is not here")
    height: int | None = Field(None, description="refused: image generation is not here")
    steps: int | None = Field(None, description="refused: image generation is not here")


class OllamaEmbedRequest(Strict):
    model: NonEmpty
    input: Annotated[Any, AfterValidator(_input)] = Field(description="a string or a list of strings")
    truncate: bool = Field(True, description="cut an input longer than the context window (false: a 400)")
    dimensions: int | None = Field(None, ge=1, description="the hidden size only (these vectors are not "
                                   "trained to be cut shorter)")
    options: OllamaOptions | None = Field(None, description="checked, no effect on an embedding")
    keep_alive: KeepAlive = None


class OllamaEmbeddingsRequest(Strict):
    model: NonEmpty
    prompt: str | None = None
    options: OllamaOptions | None = Field(None, description="checked, no effect on an embedding")
    keep_alive: KeepAlive = None


class OllamaShowRequest(Strict):
    model: str | None = None
    name: str | None = Field(None, description="deprecated spelling of model")
    verbose: bool | None = Field(None, description="accepted: nothing is left out without it")
    system: str | None = Field(None, description="accepted, ignored")
    template: str | None = Field(None, description="accepted, ignored")
    options: dict[str, Any] | None = Field(None, description="accepted, ignored")


class OllamaPullRequest(Strict):
    model: str | None = Field(None, description="hf.co/ORG/REPO[:QUANT] or ORG/REPO[:QUANT]")
    name: str | None = Field(None, description="deprecated spelling of model")
    stream: bool = Field(True, description="progress as NDJSON, one object a line (the default); false: one "
                         "object at the end")
    insecure: bool | None = Field(None, description="accepted, ignored: the hub is reached over HTTPS")
    username: str | None = Field(None, description="accepted, ignored: the hub's token is HF_TOKEN")
    password: str | None = Field(None, description="accepted, ignored: the hub's token is HF_TOKEN")


class OllamaDeleteRequest(Strict):
    model: str | None = None
    name: str | None = Field(None, description="deprecated spelling of model")


class OllamaCopyRequest(Strict):
    source: NonEmpty
    destination: NonEmpty


class OllamaError(BaseModel):
    """Ollama's error shape, used for every 4xx and 5xx of its routes."""

    error: str
