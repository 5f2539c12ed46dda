"""Temperature (fixed, or dynamic: llama.cpp's temp_ext), and Mirostat, which steers the surprise of
the text towards a target by truncating before the draw.

Dynamic temperature maps the normalised entropy of the distribution (0: certain, 1: uniform over the
tokens still alive) to a temperature in [temperature - range, temperature + range], raised to
`exponent`: sure steps are sampled cooler, open ones hotter.

Mirostat (Basu et al. 2021) keeps mu, a running bound on the surprise (-log2 p) of the next token,
starting at 2 tau. Version 1 estimates the distribution's Zipf exponent from its top 100 tokens and
keeps the k that make the expected surprise mu; version 2 keeps the tokens whose surprise is at most
mu. The chain's draw then picks from what it kept (the same seeded stream as any draw), and when the
picked token is accepted, mu moves by eta times (its surprise - tau).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from nexttok.generation.stages.filters import keep_only
from nexttok.generation.stages.spec import GREEDY_BELOW, NEG_INF, Bound, StageSpec, Stateless


class Temperature(Stateless):
    """logits / t; with range > 0, t is dynamic (see above). A dynamic t of 0 keeps the top token only."""

    name = "temperature"

    def __init__(self, t: float, range_: float = 0.0, exponent: float = 1.0):
        self.t, self.range, self.exponent = t, range_, exponent
        self.note = ""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.range <= 0:
            return logits / self.t
        alive = int((logits > NEG_INF).sum())
        if alive <= 1:
            return logits
        low, high = max(0.0, self.t - self.range), self.t + self.range
        p = logits.float().softmax(-1)
        p = p[p > 0]
        normalized = float(-(p * p.log()).sum()) / math.log(alive)
        t = low + (high - low) * normalized ** self.exponent
        self.note = f"entropy {normalized:.2f} of the most it could be: T = {t:.3f}"
        if t <= 0:  # llama.cpp's temperature 0: the first most likely token alone
            return keep_only(logits, torch.argmax(logits)[None])
        return logits / t

    def apply_kept(self, values: np.ndarray) -> np.ndarray:
        """apply on top-k's kept logits as a float32 array (a fixed t divides in float32, as torch)."""
        if self.range <= 0:
            return values / np.float32(self.t)
        return self.apply(torch.from_numpy(values)).numpy()


class Mirostat:
    """Mirostat version 1 or 2 (see above); its state is mu, moved by each accepted token."""

    name = "mirostat"
    M = 100  # version 1: top tokens that estimate the Zipf exponent (llama.cpp's m)

    def __init__(self, version: int, tau: float, eta: float, vocab_size: int):
        self.version, self.tau, self.eta, self.vocab_size = version, tau, eta, vocab_size
        self.mu, self.kept, self.note = 2 * tau, None, ""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        probs = logits.float().softmax(-1)
        if self.version == 1:
            kept = keep_only(logits, top_ids(probs, self._k(probs)))
        else:
            surprise = -torch.log2(probs)
            kept = logits.masked_fill(surprise > self.mu, NEG_INF)
            if not bool((surprise <= self.mu).any()):
                kept = keep_only(logits, torch.argmax(probs)[None])
        self.kept = kept
        self.note = f"mu {self.mu:.3f}: {int((kept > NEG_INF).sum())} tokens kept"
        return kept

    def _k(self, probs: torch.Tensor) -> int:
        """Version 1's k: the Zipf exponent s of the top M probabilities (least squares over
        log(p_i / p_i+1) against log((i + 2) / (i + 1))), then the k whose expected surprise is mu."""
        top = torch.topk(probs, min(self.M, int((probs > 0).sum()))).values.double().cpu().numpy()
        if top.size < 2:
            return 1
        t = np.log(np.arange(2, top.size + 1) / np.arange(1, top.size))
        s = float((t * np.log(top[:-1] / top[1:])).sum() / (t * t).sum())
        epsilon = s - 1
        with np.errstate(all="ignore"):
            k = ((epsilon * 2.0**self.mu) / (1 - float(self.vocab_size) ** -epsilon)) ** (1 / s)
        return max(1, min(int(k), probs.shape[-1])) if math.isfinite(k) else probs.shape[-1]

    def accept(self, token_id: int) -> None:
        """mu -= eta * (surprise of the token, under what this stage kept, - tau)."""
        p = 0.0 if self.kept is None else float(self.kept.float().softmax(-1)[token_id])
        if p > 0:  # a token it did not see, or cut (the explainer's branch), teaches it nothing
            self.mu -= self.eta * (-math.log2(p) - self.tau)
        self.kept = None

    def reset(self) -> None:
        self.mu, self.kept = 2 * self.tau, None

    def clone(self, uniforms) -> Mirostat:
        copy = Mirostat(self.version, self.tau, self.eta, self.vocab_size)
        copy.mu, copy.kept = self.mu, self.kept
        return copy


def top_ids(probs: torch.Tensor, k: int) -> torch.Tensor:
    """The ids of the k largest probabilities, equal ones by id: top_ids([.2, .4, .2, .2], 2) == [1, 0]."""
    kth = torch.topk(probs, k).values[-1]
    above = (probs > kth).nonzero()[:, 0]
    tied = (probs == kth).nonzero()[:, 0][: k - above.numel()]
    return torch.cat([above, tied])


TEMPERATURE = StageSpec(
    name="temperature",
    settings={
        "temperature": Bound(1.0, 0.0, math.inf, "divides the logits: below 1 sharpens, above 1 flattens; "
                             f"0 (below {GREEDY_BELOW:g}) = greedy", dial_high=2.0),
        "dynatemp_range": Bound(0.0, 0.0, math.inf, "dynamic temperature: the temperature moves within "
                                "temperature ± this with the distribution's entropy; 0 = fixed", dial_high=2.0),
        "dynatemp_exponent": Bound(1.0, 0.0, math.inf, "dynamic temperature: how the normalised entropy maps "
                                   "to it (entropy ** exponent)", dial_high=4.0),
    },
    use="The main creativity knob: below 1 the likely tokens get likelier (focused text), above 1 the "
        "distribution flattens (varied, riskier text); 0 takes the top token every time. A dynamic range "
        "samples sure steps cooler and open ones hotter.",
    # with Mirostat on, llama.cpp's temperature is the plain one
    active=lambda p: p.temperature != 1 or (p.dynatemp_range > 0 and not p.mirostat),
    build=lambda p, context: Temperature(p.temperature, 0.0 if p.mirostat else p.dynatemp_range,
                                         p.dynatemp_exponent),
    on_kept=True,
)

MIROSTAT = StageSpec(
    name="mirostat",
    settings={
        "mirostat": Bound(0, 0, 2, "Mirostat: 0 = off, 1 = version 1, 2 = version 2 (it replaces the "
                          "filters: only logit bias and temperature run before it)", integer=True),
        "mirostat_tau": Bound(5.0, 0.0, math.inf, "Mirostat's target surprise, in bits per token", dial_high=10.0),
        "mirostat_eta": Bound(0.1, 0.0, 1.0, "Mirostat's learning rate: how fast mu follows the surprise"),
    },
    use="For a steady level of surprise over a long text (neither boring loops nor nonsense): it keeps "
        "adjusting its own cut towards a target perplexity.",
    active=lambda p: p.mirostat != 0,
    build=lambda p, context: Mirostat(p.mirostat, p.mirostat_tau, p.mirostat_eta, context.vocab_size),
    last=True, alone_with=("logit_bias", "temperature"),  # its draw is the chain's, from the seeded stream
)
