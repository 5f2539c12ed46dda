"""Temperature: the stage that rescales the logits (below 1 sharpens, above 1 flattens), fixed or
dynamic (llama.cpp's temp_ext).

Dynamic temperature maps the normalised entropy of the distribution (0: certain, 1: uniform over the
tokens still alive) to a temperature in [temperature - range, temperature + range], raised to
`exponent`: sure steps are sampled cooler, open ones hotter.
"""

from __future__ import annotations

import math

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
    active=lambda p: p.temperature != 1 or p.dynatemp_range > 0,
    build=lambda p, context: Temperature(p.temperature, p.dynatemp_range, p.dynatemp_exponent),
    on_kept=True,
)

