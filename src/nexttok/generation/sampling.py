"""Logits → a chosen token, through a chain of stages (llama.cpp's design).

Every stage maps logits (vocab,) to logits (vocab,): penalties and logit bias change values,
truncation filters (top-k, top-p, min-p) set the tokens they cut to -inf, temperature rescales.
The chain runs like a stage (logits in, logits out), over the penalty history it holds itself: it
is told each chosen token (`accept`).
The draw is apart: greedy when temperature is 0 (< 1e-5), otherwise inverse-CDF with one uniform
number u over the kept tokens sorted by probability. u is the next of the chain's seeded stream, or
given: the explainer passes a node's stored u, so its live dials go through this same code.

Default order, as in llama.cpp: penalties → logit_bias → top_k → top_p → min_p → temperature.
nexttok.generation.parameters.PARAMETERS holds each parameter's range, default and meaning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from nexttok.errors import InvalidParameter
from nexttok.generation.parameters import DIALS, GREEDY_BELOW, PARAMETERS

STAGE_NAMES = ("penalties", "logit_bias", "top_k", "top_p", "min_p", "temperature")
DEFAULT_ORDER = STAGE_NAMES
NEG_INF = float("-inf")
RECORD_TOP = 20  # ids and probabilities a StageRecord keeps


_DEFAULT = {name: bound.default for name, bound in PARAMETERS.items()}


@dataclass
class SamplingParams:
    """What the user sets. Neutral values switch a stage off (and it is not built at all)."""

    temperature: float = _DEFAULT["temperature"]
    top_k: int = _DEFAULT["top_k"]
    top_p: float = _DEFAULT["top_p"]
    min_p: float = _DEFAULT["min_p"]
    repetition_penalty: float = _DEFAULT["repetition_penalty"]
    presence_penalty: float = _DEFAULT["presence_penalty"]
    frequency_penalty: float = _DEFAULT["frequency_penalty"]
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = _DEFAULT["seed"]
    order: Sequence[str] = DEFAULT_ORDER

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise InvalidParameter (a ValueError) naming the first parameter outside its range."""
        for name in DIALS:
            PARAMETERS[name].check(name, getattr(self, name))
        if not isinstance(self.logit_bias, dict):
            raise InvalidParameter("logit_bias", "logit_bias must be a mapping of token id to bias")
        for token, bias in self.logit_bias.items():
            if type(token) is not int or token < 0:
                raise InvalidParameter("logit_bias",
                                       f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            PARAMETERS["logit_bias"].check(f"logit_bias[{token}]", bias)
        if self.seed is not None:
            PARAMETERS["seed"].check("seed", self.seed)
        unknown = [s for s in self.order if s not in STAGE_NAMES]
        if unknown or len(set(self.order)) != len(self.order):
            raise InvalidParameter("order", f"order must list distinct stages from {', '.join(STAGE_NAMES)}; "
                                   f"got {list(self.order)}")


def check_token_ids(bias: Mapping[int, float], vocab_size: int) -> None:
    """What needs the model: logit_bias ids in its vocabulary.
    check_token_ids({9: 1.0}, 4) raises: 'logit_bias token id 9 is outside the vocabulary (0..3)'."""
    too_big = [t for t in bias if t >= vocab_size]
    if too_big:
        raise InvalidParameter("logit_bias", f"logit_bias token id {too_big[0]} is outside the "
                               f"vocabulary (0..{vocab_size - 1})")


@dataclass
class History:
    """Tokens seen so far, for penalties: the prompt and what was generated (as counts)."""

    prompt: torch.Tensor  # (T,) long
    generated_counts: torch.Tensor  # (vocab,) float: how often each token was generated

    @classmethod
    def start(cls, prompt_ids: Sequence[int], vocab_size: int, device="cpu") -> History:
        return cls(torch.tensor(list(prompt_ids), dtype=torch.long, device=device),
                   torch.zeros(vocab_size, device=device))

    def add(self, token_id: int) -> None:
        self.generated_counts[token_id] += 1

    def seen_mask(self) -> torch.Tensor:
        """(vocab,) bool: in the prompt or generated."""
        seen = self.generated_counts > 0
        seen[self.prompt[self.prompt < seen.shape[0]]] = True
        return seen


@dataclass
class StageRecord:
    """What one stage left: how many tokens survive, and the top of the distribution after it."""

    name: str
    kept: int
    entropy: float  # bits
    top_ids: list[int]
    top_probs: list[float]
    cut: list[int] = field(default_factory=list)  # which of the model's top 20 this stage cut


# ---------------------------------------------------------------------------------------------
# Stages. Each: __call__(logits (vocab,), history) -> logits (vocab,). `name` labels records.


class Penalties:
    name = "penalties"

    def __init__(self, repetition: float, presence: float, frequency: float):
        self.repetition, self.presence, self.frequency = repetition, presence, frequency

    def __call__(self, logits: torch.Tensor, history: History) -> torch.Tensor:
        if self.repetition != 1.0:
            seen = history.seen_mask()
            scaled = torch.where(logits > 0, logits / self.repetition, logits * self.repetition)
            logits = torch.where(seen, scaled, logits)
        counts = history.generated_counts
        if self.frequency:
            logits = logits - self.frequency * counts
        if self.presence:
            logits = logits - self.presence * (counts > 0).to(logits.dtype)
        return logits


class LogitBias:
    name = "logit_bias"

    def __init__(self, bias: dict[int, float], vocab_size: int):
        check_token_ids(bias, vocab_size)
        self.ids = torch.tensor(list(bias), dtype=torch.long)
        self.values = torch.tensor(list(bias.values()), dtype=torch.float32)

    def __call__(self, logits: torch.Tensor, history: History) -> torch.Tensor:
        logits = logits.clone()
        logits[self.ids.to(logits.device)] += self.values.to(logits.device, logits.dtype)
        return logits


class TopK:
    """Keep the k highest logits (ties with the k-th are kept, as in HF)."""

    name = "top_k"

    def __init__(self, k: int):
        self.k = k

    def __call__(self, logits: torch.Tensor, history: History) -> torch.Tensor:
        if self.k >= logits.shape[-1]:
            return logits
        kth = torch.topk(logits, self.k).values[-1]
        return logits.masked_fill(logits < kth, NEG_INF)


class TopP:
    """Nucleus: keep the most likely tokens whose probabilities reach p together.

    TopP(0.3) on probabilities [0.9, 0, 0, 0.1] keeps only token 0.
    """

    name = "top_p"

    def __init__(self, p: float):
        self.p = p

    def __call__(self, logits: torch.Tensor, history: History) -> torch.Tensor:
        """HF's rule (sort ascending, drop the tail whose cumulative probability is <= 1 - p, never
        the most likely token), sorting only what is left: after top_k that is k tokens, not the
        vocabulary (a full sort of 49k floats takes torch 2.6 ms, of Qwen's 152k 10 ms)."""
        alive = (logits > NEG_INF).nonzero()[:, 0]
        if alive.numel() <= 1:
            return logits
        if alive.numel() == logits.shape[-1]:
            return self._whole(logits)
        sorted_logits, order = torch.sort(logits[alive], descending=False)
        remove = sorted_logits.softmax(-1).cumsum(-1) <= 1 - self.p  # ascending: the tail first
        remove[-1] = False
        return logits.index_fill(0, alive[order[remove]], NEG_INF)

    def _whole(self, logits: torch.Tensor) -> torch.Tensor:
        """Every token alive: the cut is a probability, found by sorting values only (numpy's
        vectorised sort, ~0.1 ms for 49k), so no token order is needed."""
        probs = logits.softmax(-1)
        if probs.device.type != "cpu":
            sorted_probs = torch.sort(probs).values
        else:
            sorted_probs = torch.from_numpy(np.sort(probs.numpy()))
        cut = int((sorted_probs.cumsum(-1) <= 1 - self.p).sum())  # how many of the tail go
        if cut == 0:
            return logits
        kept_min = sorted_probs[min(cut, probs.shape[-1] - 1)]
        return logits.masked_fill(probs < kept_min, NEG_INF)


class MinP:
    """Keep tokens at least min_p times as likely as the most likely one."""

    name = "min_p"

    def __init__(self, p: float):
        self.p = p

    def __call__(self, logits: torch.Tensor, history: History) -> torch.Tensor:
        probs = logits.softmax(-1)
        return logits.masked_fill(probs < self.p * probs.max(), NEG_INF)


class Temperature:
    name = "temperature"

    def __init__(self, t: float):
        self.t = t

    def __call__(self, logits: torch.Tensor, history: History) -> torch.Tensor:
        return logits / self.t


class Uniforms:
    """The seeded stream of uniform numbers in [0, 1) that draws take, one per sampled token.
    Two streams with one seed give the same numbers (None: seeded from the OS). It lives on the
    CPU whatever the model's device, so a seed gives the same draws on every device."""

    def __init__(self, seed: int | None):
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def next(self) -> float:
        return float(torch.rand((), generator=self.generator))


class SamplerChain:
    """Stages in order, run like one stage: chain(logits) -> logits, over the penalty history the
    chain holds (the prompt, then each token it is told about with `accept`); `sample` adds the
    final draw."""

    name = "chain"

    def __init__(self, stages: Sequence, *, greedy: bool, history: History, uniforms: Uniforms, constraint=None):
        self.stages, self.greedy, self.history, self.uniforms = list(stages), greedy, history, uniforms
        self.constraint = constraint  # the grammar stage (grammar.Constraint), also told each token

    @classmethod
    def from_params(cls, params: SamplingParams, vocab_size: int, prompt_ids: Sequence[int] = (),
                    device="cpu", *, uniforms: Uniforms | None = None, constraint=None) -> SamplerChain:
        """Only the stages whose settings are not neutral are built (zero cost for the rest).
        uniforms: the stream draws come from (default: a new one seeded with params.seed).
        constraint: a grammar.Constraint, run first ("grammar"): the other stages only ever see
        tokens the grammar allows, so a filter's share of probability is a share of valid text."""
        p = params
        drawing = p.temperature >= GREEDY_BELOW  # truncation and temperature never change a greedy pick
        wanted = {
            "penalties": p.repetition_penalty != 1 or p.presence_penalty != 0 or p.frequency_penalty != 0,
            "logit_bias": bool(p.logit_bias),
            "top_k": drawing and p.top_k > 0,
            "top_p": drawing and p.top_p < 1,
            "min_p": drawing and p.min_p > 0,
            "temperature": drawing and p.temperature != 1,
        }
        make = {
            "penalties": lambda: Penalties(p.repetition_penalty, p.presence_penalty, p.frequency_penalty),
            "logit_bias": lambda: LogitBias(p.logit_bias, vocab_size),
            "top_k": lambda: TopK(p.top_k),
            "top_p": lambda: TopP(p.top_p),
            "min_p": lambda: MinP(p.min_p),
            "temperature": lambda: Temperature(p.temperature),
        }
        stages = [make[name]() for name in p.order if wanted[name]]
        if constraint is not None:
            stages.insert(0, constraint)
        return cls(stages, greedy=not drawing, history=History.start(prompt_ids, vocab_size, device),
                   uniforms=Uniforms(p.seed) if uniforms is None else uniforms, constraint=constraint)

    def accept(self, token_id: int) -> None:
        """Tell the chain the token that was chosen (it counts for the penalties from now on, and
        advances the grammar)."""
        self.history.add(token_id)
        if self.constraint is not None:
            self.constraint.accept(token_id)

    def __call__(self, logits: torch.Tensor, record: list | None = None) -> torch.Tensor:
        """Every stage in turn over the chain's history; record: a list to append a StageRecord to
        for the raw logits and after each stage."""
        history = self.history
        if record is None:
            for stage in self.stages:
                logits = stage(logits, history)
            return logits
        raw = _record("raw", logits)
        record.append(raw)
        watched = torch.tensor(raw.top_ids, dtype=torch.long, device=logits.device)
        for stage in self.stages:
            alive = logits[watched] > NEG_INF
            logits = stage(logits, history)
            cut = watched[alive & (logits[watched] == NEG_INF)]
            record.append(_record(stage.name, logits, cut.tolist()))
        return logits

    def sample(self, logits: torch.Tensor, record: list | None = None, u: float | None = None
               ) -> tuple[int, torch.Tensor, float | None]:
        """(token id, final logits, the uniform u used or None when greedy). u: the draw to use
        instead of the next one of the chain's stream (the explainer's stored draw of a node).
        The token is not accepted: the caller accepts the token it keeps."""
        check_logits(logits)
        final = self(logits.float(), record)
        if self.greedy:
            return int(torch.argmax(final)), final, None
        if u is None:
            u = self.uniforms.next()
        elif not 0 <= u < 1:
            raise ValueError(f"a draw must be in [0, 1), got {u!r}")
        return pick(final, u), final, u


def pick(logits: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw over tokens sorted by probability, equal ones by id: the token whose slice
    of [0, 1) holds u when the slices are laid out most likely first. pick([2., 0., 1.], 0.1) -> 0.
    Only the values are sorted (numpy's vectorised sort on the CPU: 0.1 ms for 49k floats, where
    torch's argsort takes 2.6 ms); the token is then the one of that value."""
    probs = logits.float().softmax(-1)
    if probs.device.type != "cpu":
        probs = probs.cpu()
    p = probs.numpy()
    alive = np.flatnonzero(p)  # after top-k or min-p, a few dozen: the rest is never sorted
    q = p[alive]
    ranked = np.sort(q)[::-1]  # descending values
    cumulative = np.cumsum(ranked, dtype=np.float64)
    index = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    index = min(index, len(ranked) - 1)  # rounding must never land past the last kept token
    value = ranked[index]
    first = int(np.searchsorted(-ranked, -value, side="left"))  # where this value's run starts
    return int(alive[np.flatnonzero(q == value)[index - first]])


def check_logits(logits: torch.Tensor) -> None:
    """NaN or +inf logits mean a broken model or input: a clear error, never a silent token."""
    top = float(logits.max())  # one reduction: NaN propagates through max, +inf is the max
    if math.isnan(top) or top == math.inf:
        bad = int((torch.isnan(logits) | (logits == math.inf)).sum())
        raise ValueError(f"model produced {bad} NaN/+inf logits; refusing to sample")
    if top == NEG_INF:
        raise ValueError("every token has -inf logit: nothing left to sample")


def entropy_bits(probs: torch.Tensor) -> float:
    """Shannon entropy in bits: entropy_bits([0.5, 0.5]) == 1.0."""
    p = probs[probs > 0]
    return float(-(p * p.log2()).sum())


def _record(name: str, logits: torch.Tensor, cut: list[int] | None = None) -> StageRecord:
    probs = logits.float().softmax(-1)
    top = torch.topk(probs, min(RECORD_TOP, probs.shape[-1]))
    return StageRecord(name, int((logits > NEG_INF).sum()), entropy_bits(probs),
                       top.indices.tolist(), top.values.tolist(), cut or [])
