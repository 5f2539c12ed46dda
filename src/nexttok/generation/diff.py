"""Two traces side by side: where they part, and whether that was a near tie.

Up to the first divergent step both runs saw the same context, so their raw distributions there are
the model's one distribution (the same model and runtime; the header differences say when not):
the gap between the two candidates is p(A's token) - p(B's token) under it, from each step's own
raw logprob. A near tie (|log p_A - log p_B| < NEAR_TIE nats) parts on a rounding or any draw; a
wide gap parts only because a sampler drew far from the top (or the model changed).

    d = diff_traces(read_trace("a.jsonl"), read_trace("b.jsonl"))
    d.divergence.index, d.divergence.gap
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nexttok.generation.trace import Trace

NEAR_TIE = 0.1  # nats: two candidates within ~10% of each other's probability


@dataclass
class Divergence:
    index: int  # the first step where the runs differ
    a: dict | None  # each run's step record there (None: that run had already ended)
    b: dict | None
    text_a: str  # each run's text from this step on
    text_b: str

    @property
    def gap(self) -> float | None:
        """p(A's token) - p(B's token) under the model's distribution at this step."""
        if self.a is None or self.b is None:
            return None
        return math.exp(self.a["logprob"]) - math.exp(self.b["logprob"])

    @property
    def near_tie(self) -> bool:
        return self.a is not None and self.b is not None and abs(self.a["logprob"] - self.b["logprob"]) < NEAR_TIE


@dataclass
class TraceDiff:
    a: Trace
    b: Trace
    divergence: Divergence | None  # None: the same tokens to the end
    settings: list[tuple[str, object, object]] = field(default_factory=list)  # (what, in A, in B) that differ

    @property
    def identical(self) -> bool:
        return self.divergence is None


COMPARED = (("model", "sha256"), ("model", "name"), ("runtime", "dtype"), ("runtime", "device"),
            ("runtime", "kernels"), ("runtime", "compiled"), ("runtime", "kv_cache"), ("engine", "version"),
            ("engine", "torch"), ("prompt", "ids"), ("limits", "max_tokens"), ("limits", "stop"))


def diff_traces(a: Trace, b: Trace) -> TraceDiff:
    """Where a and b part (see above), and the header settings in which they differ."""
    settings = [(f"{group}.{key}", a.header[group][key], b.header[group][key]) for group, key in COMPARED
                if a.header[group][key] != b.header[group][key]]
    settings += [(f"sampling.{key}", value, b.header["sampling"][key]) for key, value in a.header["sampling"].items()
                 if value != b.header["sampling"][key]]
    ta, tb = a.token_ids, b.token_ids
    same = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb)))
    if same == len(ta) == len(tb) and a.prompt_ids == b.prompt_ids:
        return TraceDiff(a, b, None, settings)
    step_a = a.steps[same] if same < len(ta) else None
    step_b = b.steps[same] if same < len(tb) else None
    rest = lambda t: "".join(s["text"] for s in t.steps[same:])  # noqa: E731
    return TraceDiff(a, b, Divergence(same, step_a, step_b, rest(a), rest(b)), settings)
