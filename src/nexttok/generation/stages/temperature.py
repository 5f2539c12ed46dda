"""Temperature: the stage that rescales the logits (below 1 sharpens, above 1 flattens)."""

from __future__ import annotations

import math

import torch

from nexttok.generation.stages.spec import GREEDY_BELOW, Bound, StageSpec, Stateless


class Temperature(Stateless):
    name = "temperature"

    def __init__(self, t: float):
        self.t = t

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self.t


TEMPERATURE = StageSpec(
    name="temperature",
    settings={"temperature": Bound(1.0, 0.0, math.inf, "divides the logits: below 1 sharpens, above 1 "
                                   f"flattens; 0 (below {GREEDY_BELOW:g}) = greedy", dial_high=2.0)},
    use="The main creativity knob: below 1 the likely tokens get likelier (focused text), above 1 the "
        "distribution flattens (varied, riskier text); 0 takes the top token every time.",
    active=lambda p: p.temperature != 1,
    build=lambda p, context: Temperature(p.temperature),
    on_kept=True,
)
