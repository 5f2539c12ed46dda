"""Logits → a chosen token, through a chain of stages (llama.cpp's llama_sampler design).

Every stage has a `name`, `apply(logits) -> logits` over (vocab,), `accept(token_id)`, which tells
it the token that was chosen (penalties and DRY keep their own history: the prompt, then each
accepted token; the grammar stage advances its matcher; Mirostat adjusts its target), `reset` and
`clone`. Penalties, DRY and logit bias change values, truncation filters set the tokens they cut
to -inf, temperature rescales. The chain is itself a stage (apply runs them all, accept tells them
all), and it ends in its selector: Greedy (argmax; temperature 0, < 1e-5) or Draw, an inverse-CDF
draw with one uniform number u over the kept tokens sorted by probability. u is the next of the
chain's seeded stream (the stages that need chance take theirs from it too), or given: the
explainer passes a node's stored u, so its live dials go through this same code. `sample` returns a
Sample: the token, the final logits, the u used and, when asked, the record of each stage.

Each stage describes itself once (nexttok.generation.stages): SamplingParams below has a field for
every setting of every stage, with the stage's default, and checks each against its bound. The
default order is llama.cpp's (stages.STAGES).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from nexttok.errors import InvalidParameter
from nexttok.generation.stages import (
    DEFAULT_ORDER,
    GREEDY_BELOW,
    NEG_INF,
    ON_KEPT,
    ORDERED,
    REWEIGHTS,
    SEED,
    SETTINGS,
    STAGE_NAMES,
    STAGES,
    ChainContext,
    Random,
    Stage,
    StageSpec,
    Uniforms,
)
from nexttok.models import kernels

RECORD_TOP = 20  # ids and probabilities a StageRecord keeps
PICK_IN_ONE_CALL = 1024  # rows this short are drawn from by kernels.pick (longer: numpy sorts values only, faster)


class _Checked:
    """SamplingParams' checks: every field against its stage's bound, at construction."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise InvalidParameter (a ValueError) naming the first parameter outside its range."""
        for name, setting in SETTINGS.items():
            setting.check(name, getattr(self, name))
        if self.seed is not None:
            SEED.check("seed", self.seed)
        order = self.order
        if (isinstance(order, str) or any(s not in STAGE_NAMES for s in order) or len(set(order)) != len(order)):
            raise InvalidParameter("order", f"order must list distinct stages from {', '.join(STAGE_NAMES)}; "
                                   f"got {list(order) if not isinstance(order, str) else order!r}")


def _fields():
    for name, setting in SETTINGS.items():
        yield name, setting.annotation, field(default_factory=setting.fresh)
    yield "seed", int | None, field(default=None)
    yield "order", Sequence[str], field(default=DEFAULT_ORDER)


SamplingParams = dataclasses.make_dataclass("SamplingParams", list(_fields()), bases=(_Checked,), namespace={
    "__module__": __name__,
    "__doc__": "What the user sets: a field for every setting of every stage (stages.SETTINGS, with its "
               "stage's default: neutral, so the stage is not built at all), the seed of the draws, and the "
               "order of the stages."})


@dataclass
class StageRecord:
    """What one stage left: how many tokens survive, and the top of the distribution after it."""

    name: str
    kept: int
    entropy: float  # bits
    top_ids: list[int]
    top_probs: list[float]
    cut: list[int] = field(default_factory=list)  # which of the model's top 20 this stage cut
    shifted: list[tuple[int, float]] = field(default_factory=list)  # (id, logit change) it made to them (penalties)
    note: str = ""  # what it decided this step, where that is more than a cut (XTC's chance, Mirostat's mu)


class Greedy:
    """The selector of a chain at temperature 0: the most likely token, no draw."""

    name = "greedy"

    def select(self, logits: torch.Tensor, u: float | None = None) -> tuple[int, float | None]:
        if _cpu_float(logits):  # numpy's argmax (the first largest, as torch's): 5 us on 49k, torch's 60
            return int(np.argmax(logits.detach().numpy())), None
        return int(torch.argmax(logits)), None


class Draw:
    """The selector of a sampling chain: an inverse-CDF draw (pick) with u, by default the next
    number of its seeded stream."""

    name = "dist"

    def __init__(self, uniforms: Random):
        self.uniforms = uniforms

    def select(self, logits: torch.Tensor, u: float | None = None) -> tuple[int, float | None]:
        if u is None:
            u = self.uniforms.next("draw")
        elif not 0 <= u < 1:
            raise ValueError(f"a draw must be in [0, 1), got {u!r}")
        return pick(logits, u), u


@dataclass
class Sample:
    """What the chain chose: the token, the final logits (vocab,) it was chosen from, the uniform u
    of the draw (None when greedy) and, when asked, a StageRecord for the raw logits and after each
    stage."""

    token_id: int
    final: torch.Tensor | tuple  # the final logits, or (ids, values, like): spread into them when first read
    draw: float | None
    stages: list[StageRecord] | None = None
    seconds: float = 0.0  # the chain's time: its stages and the selection

    @property
    def logits(self) -> torch.Tensor:
        """The final logits (vocab,), -inf where the chain cut (made on first use: most steps of a
        run never read them)."""
        if isinstance(self.final, tuple):
            self.final = spread(*self.final)
        return self.final


class SamplerChain:
    """Stages in order, itself a stage (apply runs them all, accept tells them all, reset and clone
    as llama.cpp's chain), ending in its selector (Greedy or Draw); `sample` is apply then select.
    uniforms: the stream its draws, and the stages that need chance, take their numbers from."""

    name = "chain"

    def __init__(self, stages: Sequence[Stage], selector: Greedy | Draw, uniforms: Random | None = None):
        self.stages, self.selector = list(stages), selector
        self.uniforms = selector.uniforms if uniforms is None and isinstance(selector, Draw) else uniforms

    @property
    def greedy(self) -> bool:
        return isinstance(self.selector, Greedy)

    @classmethod
    def from_params(cls, params: SamplingParams, vocab_size: int, prompt_ids: Sequence[int] = (),
                    device="cpu", *, uniforms: Random | None = None, constraint: Stage | None = None,
                    tokenizer=None) -> SamplerChain:
        """Only the stages whose settings are not neutral are built (zero cost for the rest; see
        chain_specs). uniforms: the stream draws come from (default: a new one seeded with
        params.seed). constraint: a grammar.Constraint, run first ("grammar"): the other stages only
        ever see tokens the grammar allows, so a filter's share of probability is a share of valid
        text. tokenizer: the model's, for the stages that need one (DRY's sequence breakers)."""
        uniforms = Uniforms(params.seed) if uniforms is None else uniforms
        context = ChainContext(vocab_size, list(prompt_ids), device, tokenizer, uniforms)
        stages = [spec.build(params, context) for spec in chain_specs(params)]
        if constraint is not None:
            stages.insert(0, constraint)
        return cls(stages, Draw(uniforms) if params.temperature >= GREEDY_BELOW else Greedy(), uniforms)

    def accept(self, token_id: int) -> None:
        """Tell every stage the token that was chosen (the penalties count it from now on, the
        grammar advances)."""
        for stage in self.stages:
            stage.accept(token_id)

    def reset(self) -> None:
        """Every stage back to its state when built (history: the prompt only), the stream to its seed."""
        for stage in self.stages:
            stage.reset()
        if isinstance(self.uniforms, Uniforms):
            self.uniforms.reset()

    def clone(self, uniforms: Random | None = None) -> SamplerChain:
        """An independent chain in this one's state; its numbers come from uniforms (default: a copy
        of this chain's stream, which then goes on as this one would)."""
        if uniforms is None and isinstance(self.uniforms, Uniforms):
            uniforms = self.uniforms.clone()
        selector = Greedy() if self.greedy else Draw(uniforms)
        return SamplerChain([stage.clone(uniforms) for stage in self.stages], selector, uniforms)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Every stage in turn."""
        ids, values = self.kept(logits)
        return values if ids is None else spread(ids, values, logits)

    def kept(self, logits: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Every stage in turn, as (ids, values): once top-k has cut the vocabulary and only
        top-p, min-p and temperature follow, they run on the k kept logits alone (ids ascending),
        as llama.cpp's later stages see only top-k's candidates: each is then an op over 40 values,
        not over the 49k-152k of the vocabulary, and with the kernels loaded a few numpy calls on
        them (each stage's apply_kept; torch's ops cost ~5 us apiece on so few). ids is None where
        nothing was compacted (values is then the whole (vocab,) row)."""
        for i, stage in enumerate(self.stages):
            rest = self.stages[i + 1:]
            if stage.name == "top_k" and rest and all(s.name in ON_KEPT for s in rest):
                if kernels.row_ready(logits):  # the same tokens, in one pass
                    ids, values = kernels.top_k_kept(logits, stage.k)
                    if all(hasattr(later, "apply_kept") for later in rest):  # on the k values as an array
                        array = values.numpy()
                        for later in rest:
                            array = later.apply_kept(array)
                        return ids, torch.from_numpy(array)
                else:
                    logits = stage.apply(logits)
                    ids = (logits > NEG_INF).nonzero()[:, 0]
                    values = logits[ids]
                for later in rest:
                    values = later.apply(values)
                return ids, values
            logits = stage.apply(logits)
        return None, logits

    def recorded(self, logits: torch.Tensor) -> tuple[torch.Tensor, list[StageRecord]]:
        """apply, and a StageRecord of the raw logits and after each stage (which of the raw top
        tokens each stage cut)."""
        raw = _record("raw", logits)
        records = [raw]
        watched = torch.tensor(raw.top_ids, dtype=torch.long, device=logits.device)
        for stage in self.stages:
            before = logits[watched]
            logits = stage.apply(logits)
            after = logits[watched]
            cut = watched[(before > NEG_INF) & (after == NEG_INF)]
            moved = (after > NEG_INF) & (after != before) & (stage.name in REWEIGHTS)
            shifted = [(int(i), float(d)) for i, d in zip(watched[moved], (after - before)[moved], strict=True)]
            records.append(_record(stage.name, logits, cut.tolist(), shifted, getattr(stage, "note", "")))
        return logits, records

    def sample(self, logits: torch.Tensor, *, record: bool = False, u: float | None = None) -> Sample:
        """The chosen token of logits (vocab,). u: the draw to use instead of the next one of the
        stream (the explainer's stored draw of a node; ignored when greedy). record: keep each
        stage's StageRecord. The token is not accepted: the caller accepts the token it keeps."""
        start = time.perf_counter()
        if not (self.stages or record) and type(self.selector) is Greedy and _cpu_float(logits):
            # a plain greedy step: one pass, the argmax, whose value says all check_logits would (a NaN
            # is numpy's argmax, a +inf the largest, -inf the largest only when every logit is)
            token, _ = self.selector.select(logits)
            if not math.isfinite(logits.detach().numpy()[token]):
                check_logits(logits)
            return Sample(token, logits, None, None, time.perf_counter() - start)
        check_logits(logits)
        logits = logits.float()
        if record:
            (final, stages), ids = self.recorded(logits), None
        else:
            (ids, final), stages = self.kept(logits), None
        token, used = self.selector.select(final, u)
        if ids is not None:  # the draw ran over the kept logits: back to vocabulary ids
            token, final = int(ids[token]), (ids, final, logits)
        return Sample(token, final, used, stages, time.perf_counter() - start)


def chain_specs(params: SamplingParams) -> list[StageSpec]:
    """The stages params build, in order: those of params.order whose settings are not neutral, then
    the ones that run last (Mirostat); a greedy chain keeps only those that can change which token is
    the most likely (penalties, logit bias: truncation and temperature never do); and a stage that
    runs `alone_with` some others (Mirostat: llama.cpp runs only logit bias and temperature before
    it) drops the rest."""
    drawing = params.temperature >= GREEDY_BELOW
    candidates = [ORDERED[name] for name in params.order] + [spec for spec in STAGES if spec.last]
    chosen = [spec for spec in candidates if spec.active(params) and (drawing or spec.greedy)]
    alone = next((spec for spec in chosen if spec.alone_with is not None), None)
    if alone is not None:
        chosen = [spec for spec in chosen if spec is alone or spec.name in alone.alone_with]
    return chosen


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
    if probs.shape[-1] <= PICK_IN_ONE_CALL and kernels.row_ready(probs):  # top-k's few: the same steps in C++
        return int(kernels.pick(probs, u))
    return pick_probabilities(probs.numpy(), u)


def pick_probabilities(p: np.ndarray, u: float) -> int:
    """pick's draw over probabilities p (float32): sums in float64, most likely first."""
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
    # one reduction: NaN propagates through max, +inf is the max (numpy's: 5 us on 49k, torch's 11)
    top = float(logits.detach().numpy().max() if _cpu_float(logits) else logits.max())
    if math.isnan(top) or top == math.inf:
        bad = int((torch.isnan(logits) | (logits == math.inf)).sum())
        raise ValueError(f"model produced {bad} NaN/+inf logits; refusing to sample")
    if top == NEG_INF:
        raise ValueError("every token has -inf logit: nothing left to sample")


def _cpu_float(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.device.type == "cpu"


def entropy_bits(probs: torch.Tensor) -> float:
    """Shannon entropy in bits: entropy_bits([0.5, 0.5]) == 1.0."""
    p = probs[probs > 0]
    return float(-(p * p.log2()).sum())


def _record(name: str, logits: torch.Tensor, cut: list[int] | None = None,
            shifted: list[tuple[int, float]] | None = None, note: str = "") -> StageRecord:
    probs = logits.float().softmax(-1)
    top = torch.topk(probs, min(RECORD_TOP, probs.shape[-1]))
    return StageRecord(name, int((logits > NEG_INF).sum()), entropy_bits(probs),
                       top.indices.tolist(), top.values.tolist(), cut or [], shifted or [], note)
