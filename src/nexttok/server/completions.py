"""The generation routes, POST /v1/completions and POST /v1/chat/completions: a request body
becomes one GenerationPlan, each choice a Generation submitted to the model's scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from fastapi import FastAPI

from nexttok.errors import InvalidParameter
from nexttok.generate import Generation, prompt_ids_for
from nexttok.grammar import Constraint
from nexttok.parameters import DIALS
from nexttok.sampling import SamplingParams
from nexttok.server.engine import ServedModel, find_served
from nexttok.server.errors import APIError
from nexttok.server.responses import ChatFormat, CompletionFormat, ResponseFormat
from nexttok.server.schemas import ChatRequest, CompletionRequest, OutputFormat, SamplingFields
from nexttok.server.streaming import Run, respond

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True)
class GenerationPlan:
    """Generation settings shared by every choice of a request."""

    params: SamplingParams
    max_tokens: int | None  # None: until a stop or the context window is full
    stop: tuple[str, ...]
    top_n: int = 0  # top alternatives (logprobs) recorded per token
    output: OutputFormat | None = None  # response_format: each choice gets its own grammar stage

    @classmethod
    def of(cls, body: SamplingFields, max_tokens: int | None, top_n: int) -> GenerationPlan:
        """Ranges, counts and the form of logit_bias keys were checked by the request schema; what
        needs the model, by Generation. A field the body leaves out takes SamplingParams' default."""
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        given = {name: getattr(body, name) for name in DIALS if getattr(body, name) is not None}
        if given.get("top_k") == -1:  # vLLM's "off"
            given["top_k"] = 0
        bias = {int(key): value for key, value in (body.logit_bias or {}).items()}
        output = body.response_format
        if output is not None and output.type == "json_schema" and output.json_schema is None:
            raise InvalidParameter("response_format", "response_format of type json_schema needs a json_schema")
        return cls(SamplingParams(**given, logit_bias=bias, seed=body.seed), max_tokens, stop, top_n,
                   None if output is None or output.type == "text" else output)

    def params_for_choice(self, index: int) -> SamplingParams:
        """Choice i of a seeded request uses seed + i: distinct choices, each reproducible."""
        if self.params.seed is None or index == 0:
            return self.params
        return replace(self.params, seed=(self.params.seed + index) % 2**63)

    def generation(self, served: ServedModel, ids: list[int], index: int) -> Generation:
        """Choice `index` of the request, over the prompt `ids`."""
        return Generation(served.model.config, served.tokenizer, ids, self.params_for_choice(index),
                          max_tokens=self.max_tokens, stop=self.stop, top_n=self.top_n,
                          context_limit=served.context_length, constraint=self.constraint(served))

    def constraint(self, served: ServedModel) -> Constraint | None:
        """A new grammar stage for one choice (a matcher follows one text), or None."""
        if self.output is None:
            return None
        config, tokenizer = served.model.config, served.tokenizer
        if self.output.type == "json_object":
            return Constraint.json_object(tokenizer, config.vocab_size, config.eos_token_id)
        return Constraint.json_schema(tokenizer, config.vocab_size, self.output.json_schema.schema_,
                                      config.eos_token_id)


def install_generation_routes(app: FastAPI) -> None:
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        served = find_served(app.state.models, body.model)
        prompts = _completion_prompts(served, body.prompt)
        max_tokens = body.max_tokens if body.max_tokens is not None else DEFAULT_COMPLETION_TOKENS
        plan = GenerationPlan.of(body, max_tokens, top_n=body.logprobs or 0)
        jobs = [(p, i * body.n + k) for i, p in enumerate(prompts) for k in range(body.n)]
        fmt = CompletionFormat(served.name, served.tokenizer, logprobs=body.logprobs is not None)
        return await _respond(served, body, jobs, plan, fmt)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest):
        served = find_served(app.state.models, body.model)
        if served.chat_template is None:
            raise APIError(400, f"model {served.name!r} has no chat template; use /v1/completions",
                           param="messages", code="no_chat_template")
        if body.top_logprobs is not None and not body.logprobs:
            raise InvalidParameter("top_logprobs", "top_logprobs requires logprobs to be true")
        ids = _prompt_ids(served, served.tokenizer.encode(served.chat_template.render(body.messages)))
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        plan = GenerationPlan.of(body, max_tokens, top_n=(body.top_logprobs or 0) if body.logprobs else 0)
        fmt = ChatFormat(served.name, served.tokenizer, logprobs=body.logprobs, top_logprobs=body.top_logprobs or 0)
        return await _respond(served, body, [(ids, k) for k in range(body.n)], plan, fmt)


async def _respond(served: ServedModel, body: SamplingFields, jobs: Sequence[tuple[list[int], int]],
                   plan: GenerationPlan, fmt: ResponseFormat):
    """Submit every (prompt ids, choice index) job together, then answer as the body asks. Choice
    index = prompt number × n + choice of that prompt."""
    if body.stream_options is not None and not body.stream:
        raise InvalidParameter("stream_options", "stream_options is only allowed when stream is true")
    runs = [Run(ids, index, served.scheduler.submit(plan.generation(served, ids, index)), index % body.n == 0)
            for ids, index in jobs]
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return await respond(runs, fmt, stream=body.stream, include_usage=include_usage)


def _completion_prompts(served: ServedModel, prompt: str | list[int] | list[str]) -> list[list[int]]:
    """Token ids of each prompt (the schema bounds their number and rejects empty lists)."""
    if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt):
        prompt = [prompt]
    return [_prompt_ids(served, p) for p in prompt]


def _prompt_ids(served: ServedModel, prompt: str | list[int]) -> list[int]:
    return prompt_ids_for(served.model, served.tokenizer, prompt, served.context_length)
