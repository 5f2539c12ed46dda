"""Logits → a chosen token, through a chain of stages (llama.cpp's llama_sampler design).

Every stage has a `name`, `apply(logits) -> logits` over (vocab,) and `accept(token_id)`, which
tells it the token that was chosen: penalties keep their own history (the prompt, then each
accepted token), the grammar stage advances its matcher, the rest ignore it. Penalties and logit
bias change values, truncation filters (top-k, top-p, min-p) set the tokens they cut to -inf,
temperature rescales. The chain is itself a stage (apply runs them all, accept tells them all),
and it ends in its selector: Greedy (argmax; temperature 0, < 1e-5) or Draw, an inverse-CDF draw
with one uniform number u over the kept tokens sorted by probability. u is the next of the draw's
seeded stream, or given: the explainer passes a node's stored u, so its live dials go through this
same code. `sample` returns a Sample: the token, the final logits, the u used and, when asked, the
record of each stage.

Default order, as in llama.cpp: penalties → logit_bias → top_k → top_p → min_p → temperature.
nexttok.generation.parameters.PARAMETERS holds each parameter's range, default and meaning.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from nexttok.errors import InvalidParameter
from nexttok.generation.parameters import DIALS, GREEDY_BELOW, PARAMETERS
from nexttok.generation.stages import (
    NEG_INF,
    History,
    LogitBias,
    MinP,
    Penalties,
    Stage,
    Temperature,
    TopK,
    TopP,
)

STAGE_NAMES = ("penalties", "logit_bias", "top_k", "top_p", "min_p", "temperature")
DEFAULT_ORDER = STAGE_NAMES
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


@dataclass
class StageRecord:
    """What one stage left: how many tokens survive, and the top of the distribution after it."""

    name: str
    kept: int
    entropy: float  # bits
    top_ids: list[int]
    top_probs: list[float]
    cut: list[int] = field(default_factory=list)  # which of the model's top 20 this stage cut


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


class Greedy:
    """The selector of a chain at temperature 0: the most likely token, no draw."""

    name = "greedy"

    def select(self, logits: torch.Tensor, u: float | None = None) -> tuple[int, float | None]:
        return int(torch.argmax(logits)), None


class Draw:
    """The selector of a sampling chain: an inverse-CDF draw (pick) with u, by default the next
    number of its seeded stream."""

    name = "dist"

    def __init__(self, uniforms: Uniforms):
        self.uniforms = uniforms

    def select(self, logits: torch.Tensor, u: float | None = None) -> tuple[int, float | None]:
        if u is None:
            u = self.uniforms.next()
        elif not 0 <= u < 1:
            raise ValueError(f"a draw must be in [0, 1), got {u!r}")
        return pick(logits, u), u


@dataclass
class Sample:
    """What the chain chose: the token, the final logits (vocab,) it was chosen from, the uniform u
    of the draw (None when greedy) and, when asked, a StageRecord for the raw logits and after each
    stage."""

    token_id: int
    logits: torch.Tensor
    draw: float | None
    stages: list[StageRecord] | None = None
    seconds: float = 0.0  # the chain's time: its stages and the selection


class SamplerChain:
    """Stages in order, itself a stage (apply runs them all, accept tells them all), ending in its
    selector (Greedy or Draw); `sample` is apply then select."""

    name = "chain"

    def __init__(self, stages: Sequence[Stage], selector: Greedy | Draw):
        self.stages, self.selector = list(stages), selector

    @property
    def greedy(self) -> bool:
        return isinstance(self.selector, Greedy)

    @classmethod
    def from_params(cls, params: SamplingParams, vocab_size: int, prompt_ids: Sequence[int] = (),
                    device="cpu", *, uniforms: Uniforms | None = None, constraint: Stage | None = None
                    ) -> SamplerChain:
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
            "penalties": lambda: Penalties(p.repetition_penalty, p.presence_penalty, p.frequency_penalty,
                                           History.start(prompt_ids, vocab_size, device)),
            "logit_bias": lambda: LogitBias(p.logit_bias, vocab_size),
            "top_k": lambda: TopK(p.top_k),
            "top_p": lambda: TopP(p.top_p),
            "min_p": lambda: MinP(p.min_p),
            "temperature": lambda: Temperature(p.temperature),
        }
        stages = [make[name]() for name in p.order if wanted[name]]
        if constraint is not None:
            stages.insert(0, constraint)
        selector = Draw(Uniforms(p.seed) if uniforms is None else uniforms) if drawing else Greedy()
        return cls(stages, selector)

    def accept(self, token_id: int) -> None:
        """Tell every stage the token that was chosen (the penalties count it from now on, the
        grammar advances)."""
        for stage in self.stages:
            stage.accept(token_id)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Every stage in turn."""
        ids, values = self.kept(logits)
        return values if ids is None else spread(ids, values, logits)

    def kept(self, logits: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Every stage in turn, as (ids, values): once top-k has cut the vocabulary and only
        top-p, min-p and temperature follow, they run on the k kept logits alone (ids ascending),
        as llama.cpp's later stages see only top-k's candidates: each is then an op over 40 values,
        not over the 49k-152k of the vocabulary. ids is None where nothing was compacted (values
        is then the whole (vocab,) row)."""
        for i, stage in enumerate(self.stages):
            logits = stage.apply(logits)
            rest = self.stages[i + 1:]
            if isinstance(stage, TopK) and rest and all(isinstance(s, ON_KEPT) for s in rest):
                ids = (logits > NEG_INF).nonzero()[:, 0]
                values = logits[ids]
                for later in rest:
                    values = later.apply(values)
                return ids, values
        return None, logits

    def recorded(self, logits: torch.Tensor) -> tuple[torch.Tensor, list[StageRecord]]:
        """apply, and a StageRecord of the raw logits and after each stage (which of the raw top
        tokens each stage cut)."""
        raw = _record("raw", logits)
        records = [raw]
        watched = torch.tensor(raw.top_ids, dtype=torch.long, device=logits.device)
        for stage in self.stages:
            alive = logits[watched] > NEG_INF
            logits = stage.apply(logits)
            cut = watched[alive & (logits[watched] == NEG_INF)]
            records.append(_record(stage.name, logits, cut.tolist()))
        return logits, records

    def sample(self, logits: torch.Tensor, *, record: bool = False, u: float | None = None) -> Sample:
        """The chosen token of logits (vocab,). u: the draw to use instead of the next one of the
        stream (the explainer's stored draw of a node; ignored when greedy). record: keep each
        stage's StageRecord. The token is not accepted: the caller accepts the token it keeps."""
        start = time.perf_counter()
        check_logits(logits)
        logits = logits.float()
        if record:
            (final, stages), ids = self.recorded(logits), None
        else:
            (ids, final), stages = self.kept(logits), None
        token, used = self.selector.select(final, u)
        if ids is not None:  # the draw ran over the kept logits: back to vocabulary ids
            token, final = int(ids[token]), spread(ids, final, logits)
        return Sample(token, final, used, stages, time.perf_counter() - start)


ON_KEPT = (TopP, MinP, Temperature)  # stages that may run on top-k's kept logits alone


def spread(ids: torch.Tensor, values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Kept values back into a (vocab,) row, -inf elsewhere."""
    return torch.full_like(like, NEG_INF).index_copy_(0, ids, values)


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
