"""The autoregressive loop, in three layers.

generate_step  prefill the prompt, then one token per step through the KV cache (ids only)
stream         a typed Step per token: text delta, logprobs, alternatives, timing, finish_reason
generate       the whole completion as a string, with usage

Stops: a stop token id (EOS), a stop string (text that might be the start of one is held back; the
stop string itself is never emitted), max_tokens, or the context window being full (finish_reason
"length", like max_tokens: generation ends cleanly at the model's last position).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from nexttok.cache import KVCache
from nexttok.detokenizer import IncrementalDetokenizer
from nexttok.errors import InvalidParameter
from nexttok.sampling import History, SamplerChain, SamplingParams, StageRecord
from nexttok.tokenizer import Tokenizer


@dataclass
class Alternative:
    id: int
    text: str
    logprob: float


@dataclass
class Step:
    """One generated token and everything known about it; CLI, server and page all read this."""

    index: int  # 0 for the first generated token
    token_id: int
    text: str  # text this step releases ('' while a character or a possible stop string is pending)
    token_text: str  # the token's own text, for display (partial UTF-8 bytes as \xNN)
    logprob: float  # log-probability under the model's raw distribution
    rank: int  # 1 = the model's most likely token
    top: list[Alternative]  # the model's top alternatives (raw logprobs)
    top_filtered: list[Alternative]  # after the sampler chain (filters, penalties, temperature)
    draw: float | None  # the uniform number of the draw; None when greedy
    elapsed: float  # seconds for this step: forward pass + sampling
    prefill: bool  # this step's forward pass was the prompt
    finish_reason: str | None = None  # "stop" | "length" on the last step
    stages: list[StageRecord] | None = None  # per-stage records when asked for


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    elapsed: float
    steps: list[Step] = field(default_factory=list)

    @property
    def decode_tokens_per_second(self) -> float:
        decode = [s.elapsed for s in self.steps if not s.prefill]
        return len(decode) / sum(decode) if decode and sum(decode) > 0 else 0.0


@dataclass
class RawStep:
    token_id: int
    logits: torch.Tensor  # (vocab,) the model's raw logits
    final: torch.Tensor  # (vocab,) after the sampler chain
    draw: float | None
    elapsed: float
    prefill: bool
    stages: list[StageRecord] | None


def generate_step(model, prompt_ids: Sequence[int], sampler: SamplerChain, history: History, *,
                  use_cache: bool = True, max_len: int | None = None,
                  record_stages: bool = False) -> Iterator[RawStep]:
    """Yield one RawStep per generated token, forever or until the context (max_len) is full.

    use_cache=False recomputes the whole context every step, to show what the cache saves.
    """
    config = model.config
    limit = min(max_len or config.max_position_embeddings, config.max_position_embeddings)
    device = next(model.parameters()).device
    context = list(prompt_ids)
    cache = KVCache.for_model(config, max_len=limit, dtype=next(model.parameters()).dtype,
                              device=device) if use_cache else None
    pending = torch.tensor([context], device=device)
    prefill = True
    while True:
        start = time.perf_counter()
        with torch.inference_mode():
            inputs = pending if use_cache else torch.tensor([context], device=device)
            logits = model(inputs, cache, last_only=True)[0, -1]  # (vocab,)
            stages = [] if record_stages else None
            token, final, u = sampler.sample(logits, history, stages)
        history.add(token)
        yield RawStep(token, logits, final, u, time.perf_counter() - start, prefill, stages)
        prefill = False
        context.append(token)
        if len(context) >= limit:
            return  # the next forward pass would have no position left
        pending = torch.tensor([[token]], device=device)


class StopStrings:
    """Holds back text that may be the start of a stop string.

    s = StopStrings(["\\n\\n"]); s.feed("a\\n") -> ("a", False); s.feed("\\nb") -> ("", True)
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to release, whether a stop string completed)."""
        self.pending += text
        found = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if found:
            released, self.pending = self.pending[: min(found)], ""
            return released, True
        hold = max((k for s in self.stops for k in range(len(s) - 1, 0, -1)
                    if self.pending.endswith(s[:k])), default=0)
        cut = len(self.pending) - hold
        released, self.pending = self.pending[:cut], self.pending[cut:]
        return released, False

    def flush(self) -> str:
        released, self.pending = self.pending, ""
        return released


def _check_generation_args(max_tokens, stop) -> list[str]:
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise InvalidParameter("max_tokens", "max_tokens must be an integer >= 1 (or None: until the "
                               f"context is full), got {max_tokens!r}")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if not all(isinstance(s, str) for s in stops):
        raise InvalidParameter("stop", "stop must be a string or a list of strings")
    return stops


def prompt_ids_for(model, tokenizer: Tokenizer, prompt: str | Sequence[int]) -> list[int]:
    """Token ids of a prompt (text gets the tokenizer's BOS, as HF does), checked against the context."""
    ids = tokenizer.encode(prompt, add_special=True) if isinstance(prompt, str) else list(prompt)
    if not ids and model.config.bos_token_id is not None:
        ids = [model.config.bos_token_id]
    if not ids:
        raise InvalidParameter("prompt", "prompt is empty and the model has no BOS token to start from")
    vocab = model.config.vocab_size
    if any(type(i) is not int or not 0 <= i < vocab for i in ids):
        raise InvalidParameter("prompt", f"prompt token ids must be integers in 0..{vocab - 1}")
    context = model.config.max_position_embeddings
    if len(ids) >= context:
        raise InvalidParameter("prompt", f"prompt is {len(ids)} tokens; the context window is {context} "
                               "(it must leave room for at least one new token)", "context_length_exceeded")
    return ids


def stream(model, tokenizer: Tokenizer, prompt: str | Sequence[int],
           params: SamplingParams | None = None, *, max_tokens: int | None = 256,
           stop: str | Sequence[str] | None = None, stop_token_ids: Sequence[int] | None = None,
           use_cache: bool = True, top_n: int = 5, record_stages: bool = False) -> Iterator[Step]:
    """Generate, yielding a Step per token; the last one carries finish_reason."""
    params = params or SamplingParams()
    stops = _check_generation_args(max_tokens, stop)
    ids = prompt_ids_for(model, tokenizer, prompt)
    device = next(model.parameters()).device
    sampler = SamplerChain.from_params(params, model.config.vocab_size, device)
    history = History.start(ids, model.config.vocab_size, device)
    stop_ids = set(model.config.eos_token_id if stop_token_ids is None else stop_token_ids)
    limit = model.config.max_position_embeddings
    detok, held = IncrementalDetokenizer(tokenizer, skip_special=True), StopStrings(stops)
    max_len = min(limit, len(ids) + max_tokens) if max_tokens else limit
    raw_steps = generate_step(model, ids, sampler, history, use_cache=use_cache, max_len=max_len,
                              record_stages=record_stages)
    for index, raw in enumerate(raw_steps):
        finish = None
        if raw.token_id in stop_ids:
            text, finish = held.feed(detok.flush())[0] + held.flush(), "stop"
        else:
            text, stopped = held.feed(detok.add(raw.token_id))
            if stopped:
                finish = "stop"
            elif len(ids) + index + 1 >= max_len:
                text, finish = text + held.feed(detok.flush())[0] + held.flush(), "length"
        yield make_step(tokenizer, raw, index, text, finish, top_n)
        if finish:
            return


def _alternatives(tokenizer: Tokenizer, logprobs: torch.Tensor, n: int) -> list[Alternative]:
    top = torch.topk(logprobs, min(n, logprobs.shape[-1]))
    return [Alternative(i, tokenizer.pieces([i])[0].text, lp)
            for i, lp in zip(top.indices.tolist(), top.values.tolist(), strict=True)
            if lp > float("-inf")]


def make_step(tokenizer, raw: RawStep, index, text, finish, top_n) -> Step:
    logprobs = torch.log_softmax(raw.logits.float(), -1)
    chosen = float(logprobs[raw.token_id])
    rank = int((logprobs > chosen).sum()) + 1
    filtered = torch.log_softmax(raw.final.float(), -1)
    return Step(index=index, token_id=raw.token_id, text=text,
                token_text=tokenizer.pieces([raw.token_id])[0].text, logprob=chosen, rank=rank,
                top=_alternatives(tokenizer, logprobs, top_n),
                top_filtered=_alternatives(tokenizer, filtered, top_n), draw=raw.draw,
                elapsed=raw.elapsed, prefill=raw.prefill, finish_reason=finish, stages=raw.stages)


def generate(model, tokenizer: Tokenizer, prompt: str | Sequence[int],
             params: SamplingParams | None = None, **options) -> Completion:
    """The whole completion at once (same options as `stream`)."""
    start = time.perf_counter()
    prompt_tokens = len(prompt_ids_for(model, tokenizer, prompt))
    steps = list(stream(model, tokenizer, prompt, params, **options))
    return Completion(
        text="".join(s.text for s in steps), token_ids=[s.token_id for s in steps],
        finish_reason=steps[-1].finish_reason or "length", prompt_tokens=prompt_tokens,
        completion_tokens=len(steps), elapsed=time.perf_counter() - start, steps=steps,
    )
