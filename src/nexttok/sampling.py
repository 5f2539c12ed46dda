"""Logits → a chosen token, through a chain of stages (llama.cpp's design).

Every stage maps logits (vocab,) to logits (vocab,): penalties and logit bias change values,
truncation filters (top-k, top-p, min-p) set the tokens they cut to -inf, temperature rescales.
The chain is itself a stage. The final draw is apart: greedy when temperature is 0 (< 1e-5), otherwise an
inverse-CDF draw with one uniform number u from a seeded generator, over the kept tokens sorted by
probability — so the same u under other dial settings picks a comparable token (the explainer's
live dials rely on this).

Default order, as in llama.cpp: penalties → logit_bias → top_k → top_p → min_p → temperature.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from nexttok.errors import InvalidParameter

STAGE_NAMES = ("penalties", "logit_bias", "top_k", "top_p", "min_p", "temperature")
GREEDY_BELOW = 1e-5  # temperatures this small draw greedily (as vLLM): dividing by them overflows
DEFAULT_ORDER = STAGE_NAMES
NEG_INF = float("-inf")


@dataclass
class SamplingParams:
    """What the user sets. Neutral values switch a stage off (and it is not built at all)."""

    temperature: float = 1.0  # 0 (or below 1e-5) = greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # HF/CTRL: divide positive logits of seen tokens, multiply negative
    presence_penalty: float = 0.0  # OpenAI: minus this once for every token already generated
    frequency_penalty: float = 0.0  # OpenAI: minus this times how often it was generated
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    order: Sequence[str] = DEFAULT_ORDER

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first parameter outside its range."""
        _check_float("temperature", self.temperature, 0.0, math.inf, "a number >= 0")
        if type(self.top_k) is not int or self.top_k < 0:
            raise InvalidParameter("top_k", f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        _check_float("top_p", self.top_p, 0.0, 1.0, "in (0, 1]", low_open=True)
        _check_float("min_p", self.min_p, 0.0, 1.0, "in [0, 1]")
        _check_float("repetition_penalty", self.repetition_penalty, 0.0, math.inf, "a number > 0",
                     low_open=True)
        _check_float("presence_penalty", self.presence_penalty, -2.0, 2.0, "in [-2, 2]")
        _check_float("frequency_penalty", self.frequency_penalty, -2.0, 2.0, "in [-2, 2]")
        if not isinstance(self.logit_bias, dict):
            raise InvalidParameter("logit_bias", "logit_bias must be a mapping of token id to bias")
        for token, bias in self.logit_bias.items():
            if type(token) is not int or token < 0:
                raise InvalidParameter("logit_bias",
                                       f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            _check_float(f"logit_bias[{token}]", bias, -100.0, 100.0, "in [-100, 100]")
        if self.seed is not None and (type(self.seed) is not int or not 0 <= self.seed < 2**63):
            raise InvalidParameter("seed", f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        unknown = [s for s in self.order if s not in STAGE_NAMES]
        if unknown or len(set(self.order)) != len(self.order):
            raise InvalidParameter("order", f"order must list distinct stages from {', '.join(STAGE_NAMES)}; "
                                   f"got {list(self.order)}")


def _check_float(name, value, low, high, allowed, low_open=False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        raise InvalidParameter(name.split("[")[0], f"{name} must be {allowed}, got {value!r}")


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
        too_big = [t for t in bias if t >= vocab_size]
        if too_big:
            raise InvalidParameter("logit_bias", f"logit_bias token id {too_big[0]} is outside the "
                                   f"vocabulary (0..{vocab_size - 1})")
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
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)  # ascending: the tail first
        remove = cumulative <= 1 - self.p
        remove[-1] = False  # always keep the most likely token
        return logits.masked_fill(remove.scatter(0, order, remove), NEG_INF)


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


class SamplerChain:
    """Stages in order; itself a stage. `sample` adds the final draw."""

    name = "chain"

    def __init__(self, stages: Sequence, temperature: float, seed: int | None, device="cpu"):
        self.stages = list(stages)
        self.greedy = temperature < GREEDY_BELOW
        self.generator = torch.Generator(device=device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    @classmethod
    def from_params(cls, params: SamplingParams, vocab_size: int, device="cpu") -> SamplerChain:
        """Only the stages whose settings are not neutral are built (zero cost for the rest)."""
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
        return cls(stages, params.temperature, params.seed, device)

    def __call__(self, logits: torch.Tensor, history: History, record: list | None = None) -> torch.Tensor:
        if record is not None:
            record.append(_record("raw", logits))
        for stage in self.stages:
            logits = stage(logits, history)
            if record is not None:
                record.append(_record(stage.name, logits))
        return logits

    def draw_uniform(self) -> float:
        """The next uniform number of this chain's seeded stream."""
        return float(torch.rand((), generator=self.generator))

    def sample(self, logits: torch.Tensor, history: History, record: list | None = None
               ) -> tuple[int, torch.Tensor, float | None]:
        """(token id, final logits, the uniform u used or None when greedy)."""
        check_logits(logits)
        final = self(logits.float(), history, record)
        if self.greedy:
            return int(torch.argmax(final)), final, None
        u = self.draw_uniform()
        return pick(final, u), final, u


def pick(logits: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw over tokens sorted by probability: pick([2., 0., 1.], 0.1) -> 0."""
    probs, order = torch.sort(logits.float().softmax(-1), descending=True)
    cumulative = probs.cumsum(-1)
    index = int(torch.searchsorted(cumulative, torch.tensor([u * float(cumulative[-1])]), right=True))
    index = min(index, int((probs > 0).sum()) - 1)  # rounding must never land on a cut token
    return int(order[index])


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


def _record(name: str, logits: torch.Tensor, n: int = 20) -> StageRecord:
    probs = logits.float().softmax(-1)
    top = torch.topk(probs, min(n, probs.shape[-1]))
    return StageRecord(name, int((logits > NEG_INF).sum()), entropy_bits(probs),
                       top.indices.tolist(), top.values.tolist())
