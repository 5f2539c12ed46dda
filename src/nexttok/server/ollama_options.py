"""Ollama's `options` as a GenerationPlan, the one the OpenAI routes run: each option honoured,
refused unless it is off, or accepted and ignored (ollama_schemas.OllamaOptions says which)."""

from __future__ import annotations

from nexttok.errors import InvalidParameter
from nexttok.generation.sampling import SamplingParams
from nexttok.server.completions import GenerationPlan
from nexttok.server.ollama_schemas import OllamaOptions

# Ollama's defaults where a request leaves an option out (api/types.go, DefaultOptions); the rest
# are the neutral ones (min_p 0, repeat_penalty 1, no presence or frequency penalty)
OLLAMA_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
SAMPLING = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
            "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
            "frequency_penalty": "frequency_penalty", "repeat_last_n": "repeat_last_n", "typical_p": "typical_p",
            "mirostat": "mirostat", "mirostat_tau": "mirostat_tau", "mirostat_eta": "mirostat_eta"}  # -> SamplingParams
# samplers nexttok does not have: the option is taken only at the value that switches it off
UNAVAILABLE = {"tfs_z": (1.0, "tail-free sampling (removed from llama.cpp too)")}


def plan_of(options: OllamaOptions | None, *, top_n: int = 0, logprobs: bool = False,
            schema: dict | None = None) -> GenerationPlan:
    """The plan of a request's options: plan_of(OllamaOptions(num_predict=5, temperature=0)) runs
    greedy for at most 5 tokens; num_ctx bounds prompt + output (the plan's context_limit, capped
    by the server's window). top_n: alternatives recorded per token (top_logprobs); logprobs: each
    token's own logprob, asked for; schema: the JSON schema the output follows (format, or the
    tools' reply)."""
    options = options or OllamaOptions()
    _refuse_unavailable(options)
    given = {field: getattr(options, name) for name, field in SAMPLING.items() if getattr(options, name) is not None}
    dials = {**OLLAMA_DEFAULTS, **given}
    seed = options.seed if options.seed is not None and options.seed >= 0 else None  # Ollama's -1: a fresh one
    limit = options.num_predict if options.num_predict is not None and options.num_predict > 0 else None
    return GenerationPlan(SamplingParams(**dials, seed=seed), limit, tuple(options.stop or ()), top_n, schema,
                          context_limit=options.num_ctx, logprobs=logprobs or top_n > 0)


def _refuse_unavailable(options: OllamaOptions) -> None:
    for name, (off, what) in UNAVAILABLE.items():
        value = getattr(options, name)
        if value is not None and value != off:
            raise InvalidParameter("options", f"options.{name}: {what} is not available here; send {off:g} (off) "
                                   f"or leave it out, got {value!r}")
