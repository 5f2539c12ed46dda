"""The generation routes, POST /v1/completions and POST /v1/chat/completions: a request body
becomes one GenerationPlan, each choice a Generation submitted to the model's scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import anyio
from fastapi import APIRouter, Request

from nexttok.errors import InvalidParameter
from nexttok.generation.grammar import Constraint, check_schema_depth
from nexttok.generation.loop import Generation, prompt_ids_for
from nexttok.generation.sampling import SamplingParams
from nexttok.generation.tools import Tool, from_functions, parse_choice, parse_tools, reply_schema, with_tools
from nexttok.server.engine import ServedModel
from nexttok.server.errors import APIError
from nexttok.server.openai_shapes import ChatFormat, CompletionFormat, ResponseFormat, ToolCallFormat
from nexttok.server.routing import EVENTS, streams
from nexttok.server.schemas import ChatRequest, CompletionRequest, OutputFormat, SamplingFields, stage_settings
from nexttok.server.scoring import best_choices, fim_ids, prompt_text, score_prompts
from nexttok.server.streaming import Run, close, respond
from nexttok.server.traces import tracer

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_CHOICES = 64  # prompts × n (or best_of) in one request: the scheduler's default waiting line


@dataclass(frozen=True)
class GenerationPlan:
    """Generation settings shared by every choice of a request."""

    params: SamplingParams
    max_tokens: int | None  # None: until a stop or the context window is full
    stop: tuple[str, ...]
    top_n: int = 0  # top alternatives (logprobs) recorded per token
    schema: dict | None = None  # the JSON schema the output follows (response_format, tools): a grammar stage
    prompt_top_n: int | None = None  # score the prompt's tokens too, with this many alternatives (echo)
    context_limit: int | None = None  # a request's own, smaller context window (Ollama's num_ctx)
    logprobs: bool = False  # each token's logprob and rank: asked for, best_of's ranking or a trace needs them


    @classmethod
    def of(cls, body: SamplingFields, max_tokens: int | None, top_n: int, logprobs: bool = False) -> GenerationPlan:
        """Ranges, counts and the form of logit_bias keys were checked by the request schema; what
        needs the model, by Generation. A field the body leaves out takes SamplingParams' default.
        Each token's logprob is computed where logprobs (or top_n) asks for it or a trace records it."""
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        traced = bool(body.nexttok and body.nexttok.trace)
        return cls(SamplingParams(**stage_settings(body), seed=body.seed), max_tokens, stop, top_n,
                   _output_schema(body.response_format), logprobs=logprobs or top_n > 0 or traced)

    def params_for_choice(self, index: int) -> SamplingParams:
        """Choice i of a seeded request uses seed + i: distinct choices, each reproducible."""
        if self.params.seed is None or index == 0:
            return self.params
        return replace(self.params, seed=(self.params.seed + index) % 2**63)

    def generation(self, served: ServedModel, ids: list[int], index: int) -> Generation:
        """Choice `index` of the request, over the prompt `ids`."""
        return Generation(served.model.config, served.tokenizer, ids, self.params_for_choice(index),
                          max_tokens=self.max_tokens, stop=self.stop, top_n=self.top_n,
                          context_limit=self.context(served), constraint=self.constraint(served),
                          prompt_top_n=self.prompt_top_n, logprobs=self.logprobs)

    def context(self, served: ServedModel) -> int:
        """Positions prompt + completion may take: the server's window for the model, or the
        request's own when smaller."""
        own = self.context_limit
        return served.context_length if own is None else min(own, served.context_length)

    def constraint(self, served: ServedModel) -> Constraint | None:
        """A new grammar stage for one choice (a matcher follows one text), or None."""
        if self.schema is None:
            return None
        config = served.model.config
        return Constraint.json_schema(served.tokenizer, config.vocab_size, self.schema, config.eos_token_id)


def _output_schema(output: OutputFormat | None) -> dict | None:
    """The schema of response_format: json_object = any object; text (or none) = no constraint."""
    if output is None or output.type == "text":
        return None
    if output.type == "json_object":
        return {"type": "object"}
    if output.json_schema is None:
        raise InvalidParameter("response_format", "response_format of type json_schema needs a json_schema")
    check_schema_depth(output.json_schema.schema_, "response_format", "response_format.json_schema.schema")
    return output.json_schema.schema_


router = APIRouter()
CHUNKS = streams(EVENTS, "data: {chunk} lines, then data: [DONE]")


@router.post("/v1/completions", responses=CHUNKS)
async def completions(body: CompletionRequest, request: Request):
    return await _complete(await request.app.state.pool.get(body.model), body)


@router.post("/v1/chat/completions", responses=CHUNKS)
async def chat_completions(body: ChatRequest, request: Request):
    return await _chat(await request.app.state.pool.get(body.model), body)


async def _complete(served: ServedModel, body: CompletionRequest):
    """/v1/completions: n (or best_of) choices per prompt; echo puts the prompt (and with logprobs
    its own scores) before each; max_tokens 0 scores the prompts without generating."""
    prompts = _completion_prompts(served, body.prompt, body.suffix)
    max_tokens = body.max_tokens if body.max_tokens is not None else DEFAULT_COMPLETION_TOKENS
    ranked = body.logprobs is not None or _best_of(body) > body.n  # best_of ranks by mean logprob
    plan = replace(GenerationPlan.of(body, max_tokens, top_n=body.logprobs or 0, logprobs=ranked),
                   prompt_top_n=_prompt_top_n(body))
    fmt = CompletionFormat(served.name, served.tokenizer, logprobs=body.logprobs is not None,
                           top_logprobs=body.logprobs or 0, echo=body.echo, prompt_logprobs=body.prompt_logprobs)
    if max_tokens == 0:
        _no_trace(body, "with max_tokens 0 nothing is generated to trace")
        return await score_prompts(served, body, prompts, plan, fmt)
    best_of = _best_of(body)
    if best_of > body.n:
        _no_trace(body, "best_of drops choices: a trace records every generated one; ask n instead")
    if len(prompts) * best_of > MAX_CHOICES:
        raise InvalidParameter("prompt", f"{len(prompts)} prompts × {best_of} choices is more than the "
                               f"{MAX_CHOICES} choices one request may ask for")
    runs = []
    for i, ids in enumerate(prompts):
        for k in range(best_of):
            generation = plan.generation(served, ids, i * best_of + k)
            if body.echo or body.prompt_logprobs is not None:
                fmt.prompt(i * best_of + k, prompt_text(served, body.prompt, i, ids), generation.prompt_scores)
            runs.append(Run(ids, i * best_of + k, served.scheduler.submit(generation), k == 0))
    if best_of > body.n:
        return await best_choices(runs, fmt, body.n, best_of)
    return await _answer(body, runs, fmt, plan, served)


async def _chat(served: ServedModel, body: ChatRequest):
    """/v1/chat/completions: the messages through the chat template, tools (or the deprecated
    functions) as a grammar over the reply."""
    legacy = body.functions is not None  # the deprecated functions / function_call pair
    ids, plan, tools = chat_plan(served, body)
    shape = dict(logprobs=body.logprobs, top_logprobs=body.top_logprobs or 0)
    fmt = (ToolCallFormat(served.name, served.tokenizer, legacy=legacy, **shape) if tools
           else ChatFormat(served.name, served.tokenizer, **shape))
    return await _respond(served, body, [(ids, k) for k in range(body.n)], plan, fmt)


def chat_plan(served: ServedModel, body: ChatRequest, max_calls: int | None = None
              ) -> tuple[list[int], GenerationPlan, list[Tool]]:
    """(prompt ids, generation plan, tools the reply may call) of a chat request; /v1/responses
    and /v1/messages make one of these too (max_calls: calls per reply when parallel)."""
    ids, body, tools, choice = chat_prompt(served, body)
    ids = _prompt_ids(served, ids)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    plan = GenerationPlan.of(body, max_tokens, top_n=(body.top_logprobs or 0) if body.logprobs else 0,
                             logprobs=bool(body.logprobs))
    if tools:
        # one call per reply unless the request asks for more (llama.cpp's default too)
        plan = replace(plan, schema=reply_schema(tools, choice, body.parallel_tool_calls is True, max_calls))
    return ids, plan, tools


def chat_prompt(served: ServedModel, body: ChatRequest) -> tuple[list[int], ChatRequest, list[Tool], str | Tool]:
    """(token ids of the prompt the chat template renders, tools' system prompt included, not yet
    checked against the context window; the request with the deprecated functions as tools; the
    tools the reply may call; tool_choice): what Anthropic's count_tokens counts."""
    if served.chat_template is None:
        raise APIError(400, f"model {served.name!r} has no chat template; use /v1/completions",
                       param="messages", code="no_chat_template")
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidParameter("top_logprobs", "top_logprobs requires logprobs to be true")
    _check_text_only(body)
    if body.functions is not None:
        if body.tools is not None:
            raise InvalidParameter("functions", "give tools or functions, not both")
        tools_list, tool_choice = from_functions(body.functions, body.function_call)
        body = body.model_copy(update={"tools": tools_list, "tool_choice": tool_choice})
    tools, choice = _tools_of(body)
    messages, extra = body.messages, {}
    if tools:
        messages = with_tools(messages, tools, choice)
        if served.chat_template.accepts_tools:
            extra["tools"] = body.tools
    return served.tokenizer.encode(served.chat_template.render(messages, **extra)), body, tools, choice


async def _respond(served: ServedModel, body: SamplingFields, jobs: Sequence[tuple[list[int], int]],
                   plan: GenerationPlan, fmt: ResponseFormat):
    """Submit every (prompt ids, choice index) job together, then answer as the body asks. Choice
    index = prompt number × n + choice of that prompt."""
    runs = [Run(ids, index, served.scheduler.submit(plan.generation(served, ids, index)), index % body.n == 0)
            for ids, index in jobs]
    return await _answer(body, runs, fmt, plan, served)


async def _answer(body: SamplingFields, runs: list[Run], fmt: ResponseFormat, plan: GenerationPlan,
                  served: ServedModel):
    try:
        if body.stream_options is not None and not body.stream:
            raise InvalidParameter("stream_options", "stream_options is only allowed when stream is true")
        wanted = bool(body.nexttok and body.nexttok.trace)
        trace = await anyio.to_thread.run_sync(tracer, served, plan) if wanted else None
    except Exception:
        await close(runs)
        raise
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await respond(runs, fmt, stream=body.stream, include_usage=include_usage, trace=trace)


def _no_trace(body: SamplingFields, why: str) -> None:
    if body.nexttok is not None and body.nexttok.trace:
        raise InvalidParameter("nexttok", f"nexttok.trace: {why}")


def _prompt_top_n(body: CompletionRequest) -> int | None:
    """Alternatives per prompt token the prefill records: for echo with logprobs and for vLLM's
    prompt_logprobs (None: the prompt is not scored)."""
    wanted = [n for n in (body.logprobs if body.echo else None, body.prompt_logprobs) if n is not None]
    return max(wanted) if wanted else None


def _best_of(body: CompletionRequest) -> int:
    """Choices to generate per prompt: best_of (at least n; never streamed, as OpenAI has it)."""
    if body.best_of is None or body.best_of == body.n:
        return body.n
    if body.best_of < body.n:
        raise InvalidParameter("best_of", f"best_of ({body.best_of}) must be at least n ({body.n})")
    if body.stream:
        raise InvalidParameter("best_of", "best_of cannot be used with stream")
    return body.best_of


def _check_text_only(body: ChatRequest) -> None:
    """The models here read and write text: audio output is refused, not silently dropped."""
    if body.audio is not None:
        raise InvalidParameter("audio", "audio output is not available: this server answers with text")
    if body.modalities is not None and "audio" in body.modalities:
        raise InvalidParameter("modalities", 'modalities: only ["text"] is available here')


def _tools_of(body: ChatRequest) -> tuple[list[Tool], str | Tool]:
    """The tools the model may call and tool_choice ([] when it may call none)."""
    if body.tools is None:
        if body.tool_choice not in (None, "none"):
            raise InvalidParameter("tool_choice", "tool_choice needs tools")
        return [], "none"
    tools = parse_tools(body.tools)
    choice = parse_choice(body.tool_choice, tools)
    if choice == "none":
        return [], "none"
    if body.response_format is not None and body.response_format.type != "text":
        raise InvalidParameter("response_format", "response_format cannot be combined with tools "
                               "(tool calls already follow a JSON schema)")
    return tools, choice


def _completion_prompts(served: ServedModel, prompt: str | list[int] | list[str],
                        suffix: str | None = None) -> list[list[int]]:
    """Token ids of each prompt (the schema bounds their number and rejects empty lists); with a
    suffix, each in the model's fill-in-the-middle form."""
    if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt):
        prompt = [prompt]
    if suffix is not None:
        return [_prompt_ids(served, fim_ids(served.tokenizer, p, suffix)) for p in prompt]
    return [_prompt_ids(served, p) for p in prompt]


def _prompt_ids(served: ServedModel, prompt: str | list[int]) -> list[int]:
    return prompt_ids_for(served.model, served.tokenizer, prompt, served.context_length)
