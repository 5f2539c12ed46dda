"""The autoregressive loop, in three layers.

generate_step  prefill the prompt, then one token per step through the KV cache, yielding the Step
               that Generation.sample makes of each: text delta, logprobs, alternatives, timing,
               finish_reason (the logprob, rank and alternatives only when asked for: logprobs,
               top_n; a greedy run without them is an argmax and the token's text)
stream         the same from a prompt (text or ids) and sampling settings
generate       the whole completion as a string, with usage

build_step is the one place a Step is made from a sampled token; the explainer uses it too.

Stops: a stop token id (EOS), a stop string (text that might be the start of one is held back; the
stop string itself is never emitted), max_tokens, or the context window being full (finish_reason
"length", like max_tokens: generation ends cleanly at the model's last position).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from nexttok.errors import InvalidParameter
from nexttok.generation.parameters import STOP_STRINGS_BOUND
from nexttok.generation.prefill import prefill
from nexttok.generation.sampling import Sample, SamplerChain, SamplingParams, StageRecord
from nexttok.generation.scoring import Alternative, PromptScores, top_alternatives
from nexttok.generation.stages import check_token_ids
from nexttok.models import Model
from nexttok.models.cache import KVCache
from nexttok.models.config import ModelConfig
from nexttok.tokenizers.detokenizer import IncrementalDetokenizer
from nexttok.tokenizers.tokenizer import Tokenizer


@dataclass
class Step:
    """One generated token and everything known about it; CLI, server and page all read this."""

    index: int  # 0 for the first generated token
    token_id: int
    text: str  # text this step releases ('' while a character or a possible stop string is pending)
    token_text: str  # the token's own text, for display (partial UTF-8 bytes as \xNN)
    logprob: float | None  # log-probability under the model's raw distribution (None: not asked for)
    rank: int | None  # 1 = the model's most likely token (None: not asked for)
    top: list[Alternative]  # the model's top alternatives (raw logprobs)
    top_filtered: list[Alternative]  # after the sampler chain (filters, penalties, temperature)
    draw: float | None  # the uniform number of the draw; None when greedy
    elapsed: float  # seconds for this step: forward pass + sampling
    prefill: bool  # this step's forward pass was the prompt
    finish_reason: str | None = None  # "stop" | "length" on the last step
    stages: list[StageRecord] | None = None  # per-stage records when asked for
    draft: Draft | None = None  # speculative decoding: the token drafted for this position, and its fate


@dataclass
class Draft:
    """What a speculative drafter proposed at a step's position, and whether the target took it
    (False: the step's token is the target's own, drawn instead)."""

    token_id: int
    accepted: bool


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    elapsed: float
    steps: list[Step] = field(default_factory=list)


class Generation:
    """One generation's state apart from the model: its sampler chain (which holds the penalty
    history), detokenizer and stop rules. `sample` turns the logits of each step into a Step record.
    The single-sequence loop below and the server's batch scheduler both drive one of these."""

    def __init__(self, config: ModelConfig, tokenizer: Tokenizer, prompt_ids: list[int], params: SamplingParams, *,
                 max_tokens: int | None = 256, stop: str | Sequence[str] | None = None,
                 stop_token_ids: Sequence[int] | None = None, top_n: int = 5, record_stages: bool = False,
                 device="cpu", context_limit: int | None = None, constraint=None,
                 prompt_top_n: int | None = None, logprobs: bool = True):
        stops = _check_generation_args(max_tokens, stop)
        check_token_ids(params.logit_bias, config.vocab_size)  # now, not at the first token
        self.tokenizer, self.prompt_ids, self.top_n, self.record_stages = tokenizer, prompt_ids, top_n, record_stages
        self.logprobs = logprobs  # each Step's logprob and rank (False with top_n 0: no log-softmax at all)
        self.params, self.vocab_size, self.device = params, config.vocab_size, device
        # The chain's tensors are made on the first sample(), in the thread that runs the model:
        # PyTorch work in a second thread (say, a server's event loop) slows the model's thread down.
        self.sampler: SamplerChain | None = None
        self.constraint = constraint  # a grammar.Constraint: this generation's grammar stage, or None
        self.stop_ids = set(config.eos_token_id if stop_token_ids is None else stop_token_ids)
        limit = context_window(config, context_limit)
        check_prompt_fits(len(prompt_ids), limit)  # a clear error for callers that skip prompt_ids_for
        self.max_len = min(limit, len(prompt_ids) + max_tokens) if max_tokens is not None else limit
        self.max_tokens = max_tokens  # 0: the prompt is only prefilled (and scored), nothing generated
        # prompt_top_n not None: the prefill scores every prompt token (with its top_n alternatives)
        self.prompt_scores = PromptScores(tokenizer, prompt_ids, prompt_top_n) if prompt_top_n is not None else None
        self.detok, self.held = IncrementalDetokenizer(tokenizer, skip_special=True), StopStrings(stops)
        self.tokens: list[int] = []
        self.finish_reason: str | None = None

    @property
    def context_length(self) -> int:
        return len(self.prompt_ids) + len(self.tokens)

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended this generation (None: it ended otherwise, or has not)."""
        return self.held.matched

    @property
    def chain(self) -> SamplerChain:
        """This generation's sampler chain (its penalties' history: the prompt and each token taken)."""
        if self.sampler is None:
            self.sampler = SamplerChain.from_params(self.params, self.vocab_size, self.prompt_ids, self.device,
                                                    constraint=self.constraint, tokenizer=self.tokenizer)
        return self.sampler

    def sample(self, logits: torch.Tensor, elapsed: float, prefill: bool) -> Step:
        """Choose the next token from the model's logits (vocab,) and describe it."""
        chosen = self.chain.sample(logits, record=self.record_stages)
        return self.take(chosen, logits, elapsed, prefill)

    def take(self, chosen: Sample, logits: torch.Tensor, elapsed: float, prefill: bool,
             draft: Draft | None = None) -> Step:
        """Make chosen (from the chain's view of logits) this generation's next token: the chain is
        told it, the stop rules read it, and its Step says what happened (draft: what a speculative
        drafter had proposed at this position)."""
        start = time.perf_counter()
        token = chosen.token_id
        self.chain.accept(token)
        self.tokens.append(token)
        text, finish = self._text(token)
        self.finish_reason = finish
        final = chosen.logits if self.top_n else None  # the chain's row is spread only for its alternatives
        step = build_step(self.tokenizer, token, logits, final, chosen.draw, index=len(self.tokens) - 1,
                          elapsed=elapsed + chosen.seconds + time.perf_counter() - start, prefill=prefill,
                          stages=chosen.stages, text=text, finish_reason=finish, top_n=self.top_n,
                          logprobs=self.logprobs)
        step.draft = draft
        return step

    def _text(self, token: int) -> tuple[str, str | None]:
        """(text released by this token, finish reason or None)."""
        held, detok = self.held, self.detok
        if token in self.stop_ids:
            return held.feed(detok.flush())[0] + held.flush(), "stop"
        text, stopped = held.feed(detok.add(token))
        if stopped:
            return text, "stop"
        if self.context_length >= self.max_len:  # max_tokens, or the context window is full
            return text + held.feed(detok.flush())[0] + held.flush(), "length"
        return text, None


def generate_step(model: Model, generation: Generation, *, use_cache: bool = True) -> Iterator[Step]:
    """Prefill the prompt, then one token per step through the KV cache, until the generation
    finishes. use_cache=False recomputes the whole context every step (what the cache saves)."""
    parameter = next(model.parameters())
    device = parameter.device
    context = list(generation.prompt_ids)
    cache = KVCache.for_model(model.config, max_len=generation.max_len, dtype=parameter.dtype,
                              device=device, windowed=True) if use_cache else None
    first = True
    while True:
        start = time.perf_counter()
        with torch.inference_mode():
            logits = _forward(model, generation, context, cache, first, device)
            if logits is None:  # max_tokens 0: the prompt is prefilled and scored, nothing more
                return
            step = generation.sample(logits, time.perf_counter() - start, first)
        yield step
        if step.finish_reason:
            return
        first = False
        context.append(step.token_id)


def _forward(model: Model, generation: Generation, context: list[int], cache: KVCache | None,
             first: bool, device: torch.device) -> torch.Tensor | None:
    """The next token's logits (vocab,): the prompt's chunked prefill on the first step (the
    server's too), then the newest token through the cache. Without a cache the whole context is
    prefilled again every step, into a scratch cache that the step drops: the same compute as one
    forward over the context, its activations bounded by the prefill's chunk."""
    if cache is not None and not first:
        return model(torch.tensor([context[-1:]], device=device), cache, last_only=True)[0, -1]
    if cache is None:
        cache = KVCache.for_model(model.config, max_len=len(context), dtype=next(model.parameters()).dtype,
                                  device=device)
    logits = prefill(model, cache, context, scores=generation.prompt_scores if first else None)
    return None if first and generation.max_tokens == 0 else logits


class StopStrings:
    """Holds back text that may be the start of a stop string.

    s = StopStrings(["\\n\\n"]); s.feed("a\\n") -> ("a", False); s.feed("\\nb") -> ("", True)
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.matched: str | None = None  # the stop string that completed, once one has

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to release, whether a stop string completed)."""
        self.pending += text
        found = [(at, s) for at, s in ((self.pending.find(s), s) for s in self.stops) if at >= 0]
        if found:
            at, self.matched = min(found, key=lambda hit: hit[0])  # the first to start; list order breaks ties
            released, self.pending = self.pending[:at], ""
            return released, True
        hold = max((held_tail(self.pending, s) for s in self.stops), default=0)
        cut = len(self.pending) - hold
        released, self.pending = self.pending[:cut], self.pending[cut:]
        return released, False

    def flush(self) -> str:
        released, self.pending = self.pending, ""
        return released


def held_tail(text: str, stop: str) -> int:
    """The length of the longest tail of text that may begin stop (text holds no whole stop):
    held_tail("ok\n", "\n\nUser:") == 1. Only tails that start with stop's first character are
    tried, so the work follows the text held, not the stop string's length."""
    at = text.find(stop[0], max(0, len(text) - len(stop) + 1))
    while at >= 0:
        if stop.startswith(text[at:]):
            return len(text) - at
        at = text.find(stop[0], at + 1)
    return 0


def _check_generation_args(max_tokens, stop, least: int = 0) -> list[str]:
    """least: 0 where a generation may only score its prompt (the server's max_tokens: 0), else 1."""
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < least):
        score = " (0: score the prompt only)" if least == 0 else ""
        raise InvalidParameter("max_tokens", f"max_tokens must be an integer >= {least}{score} (or None: until the "
                               f"context is full), got {max_tokens!r}")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if not all(isinstance(s, str) for s in stops):
        raise InvalidParameter("stop", "stop must be a string or a list of strings")
    if "" in stops:  # it would stop nothing (StopStrings skips it): a mistake, not a wish
        raise InvalidParameter("stop", f"stop strings must not be empty, got {stops!r}")
    STOP_STRINGS_BOUND.check("stop", stops)
    return stops


def context_window(config: ModelConfig, limit: int | None = None) -> int:
    """Positions a sequence (prompt + completion) may take: the model's, or limit when smaller.
    context_window(config with max_position_embeddings=1024, 256) == 256."""
    context = config.max_position_embeddings
    return context if limit is None else min(context, limit)


def prompt_ids_for(model: Model, tokenizer: Tokenizer, prompt: str | Sequence[int], context_limit: int | None = None
                   ) -> list[int]:
    """Token ids of a prompt (text gets the tokenizer's BOS, as HF does), checked against the
    context window (the model's, or context_limit when smaller)."""
    ids = tokenizer.encode(prompt, add_special=True) if isinstance(prompt, str) else list(prompt)
    if not ids and model.config.bos_token_id is not None:
        ids = [model.config.bos_token_id]
    if not ids:
        raise InvalidParameter("prompt", "prompt is empty and the model has no BOS token to start from")
    vocab = model.config.vocab_size
    if any(type(i) is not int or not 0 <= i < vocab for i in ids):
        raise InvalidParameter("prompt", f"prompt token ids must be integers in 0..{vocab - 1}")
    check_prompt_fits(len(ids), context_window(model.config, context_limit))
    return ids


def check_prompt_fits(prompt_tokens: int, context: int) -> None:
    """A prompt must leave room for at least one new token in the context window."""
    if prompt_tokens >= context:
        raise InvalidParameter("prompt", f"prompt is {prompt_tokens} tokens; the context window is {context} "
                               "(it must leave room for at least one new token)", "context_length_exceeded")


def stream(model: Model, tokenizer: Tokenizer, prompt: str | Sequence[int],
           params: SamplingParams | None = None, *, max_tokens: int | None = 256,
           stop: str | Sequence[str] | None = None, stop_token_ids: Sequence[int] | None = None,
           use_cache: bool = True, top_n: int = 5, record_stages: bool = False,
           constraint=None, logprobs: bool = True) -> Iterator[Step]:
    """Generate, yielding a Step per token; the last one carries finish_reason. constraint: a
    grammar.Constraint for this generation (its own: it advances with every token). top_n: the
    model's top alternatives each Step keeps; logprobs: the token's own logprob and rank (with
    top_n 0 and logprobs False a Step holds neither, and none is computed)."""
    _check_generation_args(max_tokens, stop, least=1)  # a stream yields at least one Step
    ids = prompt_ids_for(model, tokenizer, prompt)
    generation = Generation(model.config, tokenizer, ids, params or SamplingParams(), max_tokens=max_tokens,
                            stop=stop, stop_token_ids=stop_token_ids, top_n=top_n, record_stages=record_stages,
                            device=next(model.parameters()).device, constraint=constraint, logprobs=logprobs)
    yield from generate_step(model, generation, use_cache=use_cache)


def build_step(tokenizer: Tokenizer, token_id: int, logits: torch.Tensor, final: torch.Tensor | None,
               draw: float | None,
               *, index: int, elapsed: float, prefill: bool, stages: list[StageRecord] | None = None,
               text: str = "", finish_reason: str | None = None, top_n: int = 5, logprobs: bool = True) -> Step:
    """The Step record of a token: from the model's raw logits (vocab,) and the sampler chain's
    final logits (vocab,; read only for top_n), the draw u (None when greedy), timing and the chain's stage records.
    Only what is asked for is computed: the token's logprob and rank (logprobs, or top_n), the
    top_n alternatives before and after the chain; neither: no log-softmax over the vocabulary."""
    chosen = rank = None
    top, top_filtered = [], []
    if logprobs or top_n:
        raw = torch.log_softmax(logits.float(), -1)
        chosen = float(raw[token_id])
        rank = int((raw > chosen).sum()) + 1
        if top_n:  # the filtered distribution only for its top_n
            top, top_filtered = top_alternatives(tokenizer, torch.stack([raw, torch.log_softmax(final.float(), -1)]),
                                                 top_n)
    return Step(index=index, token_id=token_id, text=text, token_text=tokenizer.pieces([token_id])[0].text,
                logprob=chosen, rank=rank, top=top, top_filtered=top_filtered, draw=draw, elapsed=elapsed,
                prefill=prefill, finish_reason=finish_reason, stages=stages)


def generate(model: Model, tokenizer: Tokenizer, prompt: str | Sequence[int],
             params: SamplingParams | None = None, **options) -> Completion:
    """The whole completion at once (same options as `stream`)."""
    start = time.perf_counter()
    ids = prompt_ids_for(model, tokenizer, prompt)  # encoded once: stream gets the ids
    steps = list(stream(model, tokenizer, ids, params, **options))
    return Completion(
        text="".join(s.text for s in steps), token_ids=[s.token_id for s in steps],
        finish_reason=steps[-1].finish_reason or "length", prompt_tokens=len(ids),
        completion_tokens=len(steps), elapsed=time.perf_counter() - start, steps=steps,
    )
