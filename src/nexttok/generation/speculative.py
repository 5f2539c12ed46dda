"""Speculative decoding: a cheap drafter guesses the next k tokens, the model checks them all in one
forward pass, and every guess it agrees with is a token for a fraction of a step.

The verify pass feeds [last token, d1 .. dk] through the KV cache: its k + 1 rows of logits are the
model's distributions after each prefix, exactly what k + 1 plain steps would compute. Position by
position the sampler chain (its penalties fed the tokens taken so far) turns a row into the
distribution p a plain step would draw from; then
    greedy:  the draft d is taken when it is p's most likely token, else that token is;
    sampled: d is taken with probability p(d), else a token is drawn from p with d left out,
             renormalised (the standard accept/reject rule for a proposal that is certain of d,
             which both drafters here are: each output token still follows p exactly).
The first refusal ends the round with the model's own token there; k accepted drafts earn one more
token from the last row. The cache is cut back to what was taken, and the next round starts.

Drafters:
    NgramDrafter  prompt lookup: the tokens that followed the latest earlier occurrence of the
                  context's last n tokens (n from 3 down to 1); free, and good when the output
                  repeats its context (editing code, summarising or quoting a given text).
    ModelDrafter  a small model of the same tokenizer (SmolLM2-135M for a larger SmolLM2), greedy,
                  with a KV cache of its own that follows the accepted tokens.
Greedy output equals plain decoding's where a row comes out of a (k + 1)-row forward as it does
alone: bit for bit with float32 weights; with 8-bit activations (the GGUF block kernels) a near tie
can go the other way, as any change of batch shape can make it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from nexttok.generation.loop import Draft, Generation, Step, prompt_ids_for
from nexttok.generation.parameters import DRAFT_TOKENS_BOUND
from nexttok.generation.prefill import prefill
from nexttok.generation.sampling import Sample, SamplingParams, check_logits, pick
from nexttok.generation.stages import NEG_INF
from nexttok.models import Model
from nexttok.models.cache import KVCache, StateRollback
from nexttok.tokenizers.tokenizer import Tokenizer

DRAFT_TOKENS = DRAFT_TOKENS_BOUND.default  # k: tokens drafted per round (1 to 16)


class NgramDrafter:
    name = "ngram"

    def __init__(self, longest: int = 3):
        self.longest = longest

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """What followed the latest earlier match of the context's last n tokens, longest n first:
        NgramDrafter().propose([1, 2, 3, 9, 1, 2], 2) -> [3, 9]."""
        for n in range(min(self.longest, len(context) - 1), 0, -1):
            tail = list(context[-n:])
            for start in range(len(context) - n - 1, -1, -1):
                if list(context[start : start + n]) == tail:
                    return list(context[start + n : start + n + k])
        return []


class ModelDrafter:
    """A small model's greedy continuation, over a KV cache that keeps what still matches."""

    def __init__(self, model: Model, name: str = "draft"):
        self.model, self.name = model, name
        self.cache: KVCache | None = None
        self.cached: list[int] = []  # the tokens whose keys and values the cache holds

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        weights = next(self.model.parameters())
        if self.cache is None or self.cache.max_len < len(context) + k:
            self.cache = KVCache.for_model(self.model.config, max_len=max(2 * (len(context) + k), 256),
                                           dtype=weights.dtype, device=weights.device, windowed=True)
            self.cached = []
        same = 0
        while same < min(len(self.cached), len(context) - 1) and self.cached[same] == context[same]:
            same += 1
        try:
            self.cache.truncate(same)
        except StateRollback:  # a recurrent state, or window keys already dropped: start again
            same = 0
            self.cache.truncate(0)
        draft = []
        with torch.inference_mode():
            logits = prefill(self.model, self.cache, list(context), start=same)
            self.cached = list(context)
            for _ in range(k):
                draft.append(int(torch.argmax(logits)))
                if len(draft) == k:
                    break
                logits = self.model(torch.tensor([[draft[-1]]], device=weights.device), self.cache,
                                    last_only=True)[0, -1]
                self.cached.append(draft[-1])
        return draft


@dataclass
class Refusal:
    """A draft the model refused: at step `index` the drafter proposed token_id, to which the
    distribution the rule read (the chain's, after its settings) gave probability p."""

    index: int
    token_id: int
    p: float


@dataclass
class Rounds:
    """How a speculative generation went: drafted and accepted tokens, target forward passes, and
    each refusal (a Step says only that its draft was refused, not how likely the draft was)."""

    drafted: int = 0
    accepted: int = 0
    forwards: int = 0  # the model's forward calls after the prefill (one per round)
    tokens: int = 0  # tokens generated after the first
    refusals: list[Refusal] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.forwards if self.forwards else 0.0


def check_rollback(config) -> None:
    """Raise (one line) where the model cannot take back a refused draft token: its recurrent layers
    hold a state, not keys to forget (llama-server's answer is checkpoints of it; not kept here)."""
    if config.recurrent_layers:
        raise ValueError(f"speculative decoding: {config.model_type}'s recurrent layers keep a state that cannot "
                         "take back a refused draft token; generate without a drafter")


def speculative_stream(model: Model, tokenizer: Tokenizer, prompt: str | Sequence[int], params: SamplingParams,
                       drafter, *, k: int = DRAFT_TOKENS, rounds: Rounds | None = None,
                       **options) -> Iterator[Step]:
    """generate's steps, produced k + 1 at a time at the most (see above); options as stream's
    (max_tokens, stop, stop_token_ids, top_n, logprobs). rounds, when given, is filled in as it goes."""
    DRAFT_TOKENS_BOUND.check("draft_tokens", k)
    check_rollback(model.config)
    rounds = rounds if rounds is not None else Rounds()
    weights = next(model.parameters())
    ids = prompt_ids_for(model, tokenizer, prompt)
    generation = Generation(model.config, tokenizer, ids, params, device=weights.device, **options)
    cache = KVCache.for_model(model.config, max_len=generation.max_len, dtype=weights.dtype, device=weights.device,
                              windowed=True)
    start = time.perf_counter()
    with torch.inference_mode():
        logits = prefill(model, cache, ids)
    step = generation.sample(logits, time.perf_counter() - start, True)
    yield step
    context = ids + [step.token_id]
    while not step.finish_reason:
        start = time.perf_counter()
        room = generation.max_len - len(context)  # tokens still allowed, the last one never fed
        draft = drafter.propose(context, min(k, room - 1)) if room > 1 else []
        with torch.inference_mode():
            rows = model(torch.tensor([[context[-1], *draft]], device=weights.device), cache)[0]  # (1 + k, vocab)
        rounds.forwards += 1
        rounds.drafted += len(draft)
        elapsed = (time.perf_counter() - start) / (len(draft) + 1)
        for i, row in enumerate(rows):
            proposed = draft[i] if i < len(draft) else None
            chosen = verify(generation, row, proposed)
            agreed = proposed is not None and chosen.token_id == proposed
            step = generation.take(chosen, row, elapsed, False, None if proposed is None else Draft(proposed, agreed))
            rounds.accepted += agreed
            rounds.tokens += 1
            if proposed is not None and not agreed:
                rounds.refusals.append(Refusal(step.index, proposed, float(chosen.logits.softmax(-1)[proposed])))
            context.append(step.token_id)
            yield step
            if step.finish_reason or not agreed:
                break
        cache.truncate(len(context) - 1)  # the keys of every token taken but the newest


def verify(generation: Generation, logits: torch.Tensor, proposed: int | None) -> Sample:
    """The token at one position: the draft when the target agrees (greedy: its top token; sampled:
    with probability p(draft)), else the target's own (see above). After top-k the rule reads only
    the kept tokens (chain.kept): a draft top-k cut has p = 0."""
    chain = generation.chain
    start = time.perf_counter()
    check_logits(logits)
    logits = logits.float()
    ids, values = chain.kept(logits)  # ids None: values is the whole row
    final = values if ids is None else (ids, values, logits)  # the Sample spreads it if read
    if not chain.greedy and proposed is not None:
        uniforms = chain.selector.uniforms
        at = proposed if ids is None else _position(ids, proposed)
        u = uniforms.next()
        if at is not None and u < float(values.softmax(-1)[at]):
            return Sample(proposed, final, u, None, time.perf_counter() - start)
        # refused: p without the draft, renormalised by the draw (some other token is alive, since
        # a draft holding all of p is never refused)
        rest = values.clone()
        if at is not None:
            rest[at] = NEG_INF
        u = uniforms.next()
        return Sample(_token(ids, pick(rest, u)), final, u, None, time.perf_counter() - start)
    token, u = chain.selector.select(values)  # greedy, or nothing drafted here: the plain pick
    return Sample(_token(ids, token), final, u, None, time.perf_counter() - start)


def _position(ids: torch.Tensor, token: int) -> int | None:
    """Where token is among the kept ids (ascending), None where it was cut."""
    at = int(torch.searchsorted(ids, token))
    return at if at < ids.shape[0] and int(ids[at]) == token else None


def _token(ids: torch.Tensor | None, index: int) -> int:
    return index if ids is None else int(ids[index])
