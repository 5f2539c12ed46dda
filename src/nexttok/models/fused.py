"""Projections of one input fused into one matmul: q, k and v; gate and up.

One (q+k+v rows × hidden) matmul reads the input once and pays one call's overhead instead of
three, which matters at decode time, where a step is ~200 small matmuls. Checkpoints keep the parts
apart (q_proj, k_proj, v_proj), so the module says which parts make its rows, in order, and the
loaders stack them: fused_parts(module_name, linear) gives the checkpoint names.
"""

from __future__ import annotations

from torch import nn


class FusedLinear(nn.Linear):
    """A Linear whose output rows are several checkpoint projections stacked: parts maps each
    part's module name (a sibling of this module in the checkpoint) to its number of rows."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool):
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.parts = dict(parts)

    @property
    def sizes(self) -> list[int]:
        return list(self.parts.values())


def fused_parts(name: str, module: nn.Module) -> dict[str, int]:
    """Checkpoint module names (ours, unprefixed) → rows, for the module at `name`:
    fused_parts("layers.0.self_attn.qkv_proj", FusedLinear(8, {"q_proj": 8, "k_proj": 4, "v_proj": 4}, False))
    -> {"layers.0.self_attn.q_proj": 8, "layers.0.self_attn.k_proj": 4, "layers.0.self_attn.v_proj": 4}."""
    if not isinstance(module, FusedLinear):
        return {name: module.weight.shape[0]}
    parent = name.rsplit(".", 1)[0] + "." if "." in name else ""
    return {parent + part: rows for part, rows in module.parts.items()}
