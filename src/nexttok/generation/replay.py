"""Replay: a trace's tokens forced through the model again, to see what would differ now.

The recorded tokens are fed back on the schedule the run had (the prompt's chunked prefill, then
one token per step through the KV cache, or the whole context again where the run had no cache),
with no sampling: on the same build and settings every logit comes out bit for bit as it did. Each
step gets its logprob now, the model's top-1 now, and whether the sampler chain of the trace's
settings (its penalties fed the same history, its grammar the same text) would still give the
recorded token a chance. This checks another dtype, `--compile`, a new build or another machine
against a saved run:

    result = replay(model, read_trace("run.jsonl"))
    result.flips(threshold=0.05)   # steps whose top-1 changed by more than a near tie

one_pass=True scores every step in one chunked prefill over prompt + tokens instead: faster for a
long trace, but a longer forward rounds differently, and with 8-bit activations (the block kernels)
a rounding that lands elsewhere grows through the layers: on the default model logprobs then move by
~1e-2 and a flat distribution's top-1 can swap. Use it to check a model, not a build.

A step's top-1 "then" is the first of its recorded alternatives (a trace recorded with no
alternatives knows it only where the chosen token had rank 1). The margin of a changed top-1 is the
model's lead, now, of the new top-1 over the old one (in nats): a near tie flips on a rounding, a
large margin means the model changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from nexttok.generation.prefill import prefill, prefill_chunks
from nexttok.generation.sampling import SamplerChain
from nexttok.generation.stages import NEG_INF
from nexttok.generation.trace import Trace
from nexttok.models import Model
from nexttok.models.cache import KVCache


@dataclass
class ReplayStep:
    index: int
    token_id: int
    token_text: str
    logprob_then: float
    logprob_now: float
    top_then: int | None  # the model's most likely token when the trace was recorded (None: unknown)
    top_now: int
    margin: float  # logprob now of top_now minus that of top_then (0 where the top-1 is unchanged)
    kept: bool  # the sampler chain (the trace's settings) still leaves the recorded token a chance

    @property
    def delta(self) -> float:
        return self.logprob_now - self.logprob_then

    @property
    def top_changed(self) -> bool:
        return self.top_then is not None and self.top_now != self.top_then


@dataclass
class Replay:
    steps: list[ReplayStep]

    def flips(self, threshold: float) -> list[ReplayStep]:
        """Steps whose top-1 changed with a margin above threshold (nats): not a near tie."""
        return [s for s in self.steps if s.top_changed and s.margin > threshold]

    @property
    def max_delta(self) -> float:
        return max((abs(s.delta) for s in self.steps), default=0.0)


def replay(model: Model, trace: Trace, constraint=None, one_pass: bool = False, tokenizer=None) -> Replay:
    """Every step of trace scored by model (see above). constraint: the run's grammar stage, new;
    tokenizer: the model's, for the stages that need one (DRY's sequence breakers)."""
    prompt, tokens = trace.prompt_ids, trace.token_ids
    vocab = model.config.vocab_size
    if any(not 0 <= i < vocab for i in prompt + tokens):
        raise ValueError(f"{trace.name} holds token ids outside this model's vocabulary (0..{vocab - 1})")
    weights = next(model.parameters())
    chain = SamplerChain.from_params(trace.sampling_params(), vocab, prompt, weights.device, constraint=constraint,
                                     tokenizer=tokenizer)
    rows = _one_pass(model, prompt, tokens) if one_pass else _as_run(model, prompt, tokens,
                                                                      trace.header["runtime"]["kv_cache"])
    steps = []
    with torch.inference_mode():
        for record, row in zip(trace.steps, rows, strict=True):
            steps.append(_step(record, row.float(), chain))
            chain.accept(record["id"])
    return Replay(steps)


def _cache(model: Model, length: int) -> KVCache:
    weights = next(model.parameters())
    return KVCache.for_model(model.config, max_len=length, dtype=weights.dtype, device=weights.device)


def _as_run(model: Model, prompt: list[int], tokens: list[int], kv_cache: bool) -> Iterator[torch.Tensor]:
    """The logits (vocab,) before each token, computed as the generation loop did."""
    device = next(model.parameters()).device
    cache = _cache(model, len(prompt) + len(tokens)) if kv_cache else None
    context = list(prompt)
    with torch.inference_mode():
        yield prefill(model, cache if kv_cache else _cache(model, len(context)), context)
        for token in tokens[:-1]:
            context.append(token)
            if kv_cache:
                yield model(torch.tensor([[token]], device=device), cache, last_only=True)[0, -1]
            else:  # the loop without a cache: the whole context prefilled again every step
                yield prefill(model, _cache(model, len(context)), context)


def _one_pass(model: Model, prompt: list[int], tokens: list[int]) -> Iterator[torch.Tensor]:
    """The same logits from one chunked prefill over prompt + tokens."""
    device = next(model.parameters()).device
    ids = prompt + tokens
    cache, first = _cache(model, len(ids)), len(prompt) - 1  # position first's logits choose token 0
    with torch.inference_mode():
        for a, b in prefill_chunks(0, len(ids) - 1):
            rows = model(torch.tensor([ids[a:b]], device=device), cache, last_only=b <= first)[0]
            yield from (rows[position - a] for position in range(max(a, first), b))


def _step(record: dict, logits: torch.Tensor, chain: SamplerChain) -> ReplayStep:
    logprobs = torch.log_softmax(logits, -1)
    token = record["id"]
    top_now = int(torch.argmax(logprobs))
    top_then = record["top"][0]["id"] if record["top"] else (token if record["rank"] == 1 else None)
    changed = top_then is not None and top_then != top_now
    margin = float(logprobs[top_now] - logprobs[top_then]) if changed else 0.0
    kept = bool(chain.apply(logits)[token] > NEG_INF)
    return ReplayStep(record["index"], token, record["token_text"], record["logprob"], float(logprobs[token]),
                      top_then, top_now, margin, kept)
