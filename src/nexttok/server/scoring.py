"""/v1/completions beyond plain generation: a prompt scored without generating (max_tokens 0),
best_of, and fill-in-the-middle prompts (suffix).

Evaluation harnesses score text with `echo: true, logprobs: k, max_tokens: 0`: the prompt comes back
with each token's logprob under the model (the first token's null), nothing is generated. With
best_of, every candidate is generated and the n with the highest mean logprob per token (OpenAI's
"best") are returned, renumbered; usage counts every generated token.
"""

from __future__ import annotations

import asyncio

from nexttok.errors import InvalidParameter
from nexttok.server.engine import ServedModel
from nexttok.server.openai_shapes import CompletionFormat, Usage
from nexttok.server.streaming import (
    OPENAI_CHUNKS,
    Run,
    close,
    openai_stream_error,
    steps_of,
    stream_response,
    with_usage,
)

# fill-in-the-middle tokens: (prefix, suffix, middle), as Qwen2.5-Coder / StarCoder name them
FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))


def fim_ids(tokenizer, prompt: str | list[int], suffix: str) -> list[int]:
    """<prefix> prompt <suffix> suffix <middle>: the model writes what goes between (PSM order, as
    llama.cpp's /infill builds it)."""
    for names in FIM_TOKENS:
        ids = [tokenizer.token_to_id(name) for name in names]
        if all(i is not None for i in ids):
            head = tokenizer.encode(prompt, add_special=False) if isinstance(prompt, str) else list(prompt)
            return [ids[0], *head, ids[1], *tokenizer.encode(suffix, add_special=False), ids[2]]
    raise InvalidParameter("suffix", "suffix needs a model with fill-in-the-middle tokens "
                           "(<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>); this one has none")


def prompt_text(served: ServedModel, prompt: str | list[int] | list[str], i: int, ids: list[int]) -> str:
    """The text echo returns for prompt i: as sent, or decoded when it was sent as token ids."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt[0], str):
        return prompt[i]
    return served.tokenizer.decode(ids, skip_special=True)


async def score_prompts(served: ServedModel, body, prompts: list[list[int]], plan, fmt: CompletionFormat):
    """max_tokens 0: each prompt is prefilled once (scored when echo and logprobs ask for it) and
    answered n times over, with finish_reason "length" and no completion tokens."""
    generations = [plan.generation(served, ids, i) for i, ids in enumerate(prompts)]
    runs = [Run(ids, i, served.scheduler.submit(g))
            for i, (ids, g) in enumerate(zip(prompts, generations, strict=True))]
    try:
        await asyncio.gather(*(steps_of(run) for run in runs))
    finally:
        await close(runs)
    choices, usage = [], Usage()
    for i, (ids, generation) in enumerate(zip(prompts, generations, strict=True)):
        usage.add(len(ids), 0)
        for k in range(body.n):
            index = i * body.n + k
            if body.echo or body.prompt_logprobs is not None:
                fmt.prompt(index, prompt_text(served, body.prompt, i, ids), generation.prompt_scores)
            choices.append(fmt.choice(index, []))
    if not body.stream:
        return fmt.response(choices, usage)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return stream_response(OPENAI_CHUNKS, _chunks(fmt, choices, usage, include_usage), [], openai_stream_error)


async def _chunks(fmt: CompletionFormat, choices: list[dict], usage: Usage, include_usage: bool):
    for choice in choices:
        yield with_usage({**fmt.envelope(), "choices": [choice]}, include_usage)
    if include_usage:
        yield fmt.usage_chunk(usage)


async def best_choices(runs: list[Run], fmt: CompletionFormat, n: int, best_of: int) -> dict:
    """Every candidate generated together; per prompt the n best by mean logprob per token."""
    try:
        collected = await asyncio.gather(*(steps_of(run) for run in runs))
    except BaseException:
        await close(runs)
        raise
    usage, choices = Usage(), []
    for start in range(0, len(runs), best_of):
        group = list(zip(runs[start:start + best_of], collected[start:start + best_of], strict=True))
        for run, steps in group:
            usage.add(run.prompt_tokens, len(steps))
        group.sort(key=lambda pair: -sum(s.logprob for s in pair[1]) / len(pair[1]))
        for k, (run, steps) in enumerate(group[:n]):
            choice = fmt.choice(run.index, steps)
            choices.append({**choice, "index": start // best_of * n + k})
    return fmt.response(choices, usage)
