"""Truncation filters: stages that set the tokens they cut to -inf.

Each is stateless (the logits alone decide; XTC's chance comes from the chain's seeded stream). The
ones that always keep the most likely token (top-k, top-p, min-p, top-n-sigma) change nothing a
greedy chain would pick, so it skips them; the ones that may cut it run there too (StageSpec.greedy)."""

from __future__ import annotations

import math

import numpy as np
import torch

from nexttok.generation.stages.spec import NEG_INF, Bound, StageSpec, Stateless


class TopK(Stateless):
    """Keep the k highest logits (ties with the k-th are kept, as in HF)."""

    name = "top_k"

    def __init__(self, k: int):
        self.k = k

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.k >= logits.shape[-1]:
            return logits
        kth = torch.topk(logits, self.k).values[-1]
        return logits.masked_fill(logits < kth, NEG_INF)


class TopP(Stateless):
    """Nucleus: keep the most likely tokens whose probabilities reach p together.

    TopP(0.3) on probabilities [0.9, 0, 0, 0.1] keeps only token 0.
    """

    name = "top_p"

    def __init__(self, p: float):
        self.p = p

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
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

    def apply_kept(self, values: np.ndarray) -> np.ndarray:
        """apply's value rule (see _whole) on top-k's kept logits as a float32 array: the same
        operations in numpy (torch's float32 cumsum adds in float64, its comparison with a number
        rounds the number to float32), ~8 numpy calls where apply made ~15 torch ones (80 us).
        Where an earlier stage cut some (-inf), apply's HF rule decides ties by position: it runs."""
        if np.isneginf(values).any():
            return self.apply(torch.from_numpy(values)).numpy()
        probs = probabilities(values)
        ascending_probs = np.sort(probs)
        tail = np.cumsum(ascending_probs, dtype=np.float64).astype(np.float32) <= np.float32(1 - self.p)
        cut = int(np.count_nonzero(tail))  # how many of the tail go
        if cut == 0:
            return values
        kept_min = ascending_probs[min(cut, probs.shape[-1] - 1)]
        return np.where(probs < kept_min, np.float32(NEG_INF), values)

    def _whole(self, logits: torch.Tensor) -> torch.Tensor:
        """Every token alive: the cut is a probability, found by sorting values only (numpy's
        vectorised sort, ~0.1 ms for 49k), so no token order is needed."""
        probs = logits.softmax(-1)
        sorted_probs = sort_values(probs)
        cut = int((sorted_probs.cumsum(-1) <= 1 - self.p).sum())  # how many of the tail go
        if cut == 0:
            return logits
        kept_min = sorted_probs[min(cut, probs.shape[-1] - 1)]
        return logits.masked_fill(probs < kept_min, NEG_INF)


def probabilities(values: np.ndarray) -> np.ndarray:
    """softmax of a float32 array by torch's own kernel (the bits the torch path gets), as an array."""
    return torch.from_numpy(values).softmax(-1).numpy()


def sort_values(values: torch.Tensor) -> torch.Tensor:
    """values sorted ascending (numpy's sort on the CPU: 0.1 ms for 49k floats, torch's 2.6 ms)."""
    if values.device.type != "cpu":
        return torch.sort(values).values
    return torch.from_numpy(np.sort(values.numpy()))


class MinP(Stateless):
    """Keep tokens at least min_p times as likely as the most likely one."""

    name = "min_p"

    def __init__(self, p: float):
        self.p = p

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        probs = logits.softmax(-1)
        return logits.masked_fill(probs < self.p * probs.max(), NEG_INF)

    def apply_kept(self, values: np.ndarray) -> np.ndarray:
        """apply on top-k's kept logits as a float32 array (p * max in float32, as torch does it)."""
        probs = probabilities(values)
        return np.where(probs < np.float32(self.p) * probs.max(), np.float32(NEG_INF), values)


TOP_K = StageSpec(
    name="top_k",
    settings={"top_k": Bound(0, 0, math.inf, "keep the k most likely tokens (ties with the k-th too); 0 = off",
                             integer=True, dial_high=100)},
    use="A fixed cap on the candidates (llama.cpp's default is 40); after it, the later filters work on "
        "those k alone.",
    active=lambda p: p.top_k > 0,
    build=lambda p, context: TopK(p.top_k),
)

TOP_P = StageSpec(
    name="top_p",
    settings={"top_p": Bound(1.0, 0.0, 1.0, "nucleus: keep the most likely tokens whose probabilities reach p "
                             "together; 1 = off", low_open=True)},
    use="Nucleus sampling, OpenAI's knob: a cap that adapts, few candidates when the model is sure and "
        "many when it is not.",
    active=lambda p: p.top_p < 1,
    build=lambda p, context: TopP(p.top_p),
    on_kept=True,
)

MIN_P = StageSpec(
    name="min_p",
    settings={"min_p": Bound(0.0, 0.0, 1.0, "keep tokens at least min_p times as likely as the most likely one; "
                             "0 = off")},
    use="Cuts the long tail relative to the top token; popular with local models, and lets a high "
        "temperature stay coherent.",
    active=lambda p: p.min_p > 0,
    build=lambda p, context: MinP(p.min_p),
    on_kept=True,
)


def keep_only(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """logits with every token but ids set to -inf: keep_only([1., 2., 3.], [2]) == [-inf, -inf, 3.]."""
    kept = torch.zeros_like(logits, dtype=torch.bool).index_fill_(0, ids, True)
    return logits.masked_fill(~kept, NEG_INF)


class TypicalP(Stateless):
    """Locally typical sampling (Meister et al. 2022; llama.cpp's, HF's TypicalLogitsWarper): rank the
    tokens by how far their surprise (-log p) is from the distribution's entropy, closest first, and
    keep them in that order until they hold more than p together. It can cut the most likely token."""

    name = "typical_p"

    def __init__(self, p: float):
        self.p = p

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        alive = (logits > NEG_INF).nonzero()[:, 0]
        if alive.numel() <= 1:
            return logits
        logp = logits[alive].float().log_softmax(-1)
        p = logp.exp()
        entropy = -(p * logp).sum()
        shifted = (-logp - entropy).abs()
        order = ascending(shifted)  # the most typical first
        last = int(torch.searchsorted(p[order].cumsum(-1), self.p, right=True)) + 1  # past p: the first over it
        if last < order.numel() and shifted[order[last - 1]] == shifted[order[last]]:
            order = ascending(shifted, stable=True)  # a tie at the cut: the equal ones in id order
            last = int(torch.searchsorted(p[order].cumsum(-1), self.p, right=True)) + 1
        return keep_only(logits, alive[order[:last]])


def ascending(values: torch.Tensor, stable: bool = False) -> torch.Tensor:
    """The indices that sort values ascending (stable: equal ones in place). On the CPU numpy's
    argsort: 1.3 ms for 49k floats, 5 ms stable, where torch's stable sort takes ~30."""
    if values.device.type != "cpu":
        return torch.sort(values, stable=stable).indices
    return torch.from_numpy(np.argsort(values.numpy(), kind="stable" if stable else None))


class TopNSigma(Stateless):
    """Top-nσ (Tang et al. 2024): keep the tokens whose logit is within n standard deviations (over the
    tokens still alive) of the largest; unlike a probability cut it ignores temperature."""

    name = "top_n_sigma"

    def __init__(self, n: float):
        self.n = n

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        values = logits[logits > NEG_INF]
        if values.numel() <= 1:
            return logits
        spread = values.std(correction=0)  # population deviation, as llama.cpp
        return logits.masked_fill(logits < values.max() - self.n * spread, NEG_INF)


class XTC:
    """Exclude Top Choices (llama.cpp's XTC): with chance `probability` per step (a number from the
    draw's seeded stream), every token at least `threshold` likely is cut except the least likely of
    them, so the text takes a less obvious (still plausible) turn. Two or more must pass the threshold."""

    name = "xtc"

    def __init__(self, probability: float, threshold: float, uniforms):
        self.probability, self.threshold, self.uniforms = probability, threshold, uniforms
        self.note = ""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if int((logits > NEG_INF).sum()) < 2:
            self.note = "one token left: nothing drawn"
            return logits
        chance = self.uniforms.next("xtc")
        if chance > self.probability:
            self.note = f"chance {chance:.3f} > {self.probability:g}: not this step"
            return logits
        probs = logits.softmax(-1)
        above = (probs >= self.threshold).nonzero()[:, 0]
        if above.numel() < 2:
            self.note = f"chance {chance:.3f}: fewer than two tokens at p >= {self.threshold:g}"
            return logits
        ranked = above[torch.sort(probs[above], descending=True, stable=True).indices]  # equal ones by id
        self.note = f"chance {chance:.3f} <= {self.probability:g}: cut {above.numel() - 1} top tokens"
        return logits.index_fill(0, ranked[:-1], NEG_INF)  # all but the least likely of them

    def accept(self, token_id: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def clone(self, uniforms) -> XTC:
        return XTC(self.probability, self.threshold, uniforms)


TYPICAL_P = StageSpec(
    name="typical_p",
    settings={"typical_p": Bound(1.0, 0.0, 1.0, "locally typical: keep the tokens whose surprise is nearest the "
                                 "entropy, until they hold p together; 1 = off", low_open=True)},
    use="Keeps the tokens about as surprising as the model expects (not only the likeliest): natural text "
        "that avoids both dull and odd words; Ollama's typical_p.",
    active=lambda p: p.typical_p < 1,
    build=lambda p, context: TypicalP(p.typical_p),
    on_kept=True, greedy=True,
)

TOP_N_SIGMA = StageSpec(
    name="top_n_sigma",
    settings={"top_n_sigma": Bound(-1.0, -1.0, math.inf, "keep tokens whose logit is within n standard "
                                   "deviations of the top one; <= 0 = off (llama.cpp's -1)", dial_high=5.0)},
    use="A cut on the logits themselves, so it does not move with temperature: high temperatures stay "
        "coherent (n around 1).",
    active=lambda p: p.top_n_sigma > 0,
    build=lambda p, context: TopNSigma(p.top_n_sigma),
    on_kept=True,
)

XTC_SPEC = StageSpec(
    name="xtc",
    settings={"xtc_probability": Bound(0.0, 0.0, 1.0, "XTC: the chance per step that the top choices are "
                                       "excluded; 0 = off"),
              "xtc_threshold": Bound(0.1, 0.0, 1.0, "XTC: tokens at least this likely are the top choices "
                                     "(all but the least likely of them are cut); > 0.5 = off")},
    use="For variety in creative writing: now and then the most obvious continuations are removed, "
        "so the text avoids clichés while staying on track.",
    active=lambda p: p.xtc_probability > 0 and p.xtc_threshold <= 0.5,
    build=lambda p, context: XTC(p.xtc_probability, p.xtc_threshold, context.uniforms),
    on_kept=True, greedy=True, needs=frozenset({"random"}),
)
