"""The lesson's mixture of experts: what the router chose for a token, and why that is fast.

In a sparse layer (models/moe.py) a router scores the E experts for each token and keeps k of
them; the layer's output is the sum of those k experts' outputs times the router's weights, and
only their weights are read. `routing_at` takes a forward pass's capture (AttentionCapture.experts:
the router's own decision, not a second computation of it) at one position; `expert_facts` counts
the parameters a token meets, all of them vs those it reads, from the config, and the bytes the
loaded model holds its experts in. Dense models have neither (None / []). Values are unrounded:
presentation rounds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nexttok.models import Model
from nexttok.models.moe import SparseMoE


@dataclass(frozen=True)
class LayerRouting:
    """A sparse layer's router at one position: ids (k,) of the chosen experts and weights (k,)
    their outputs are summed with, in the router's order; probs (E,) every expert's score (softmax
    or sigmoid: config.router)."""

    layer: int
    ids: torch.Tensor
    weights: torch.Tensor
    probs: torch.Tensor

    def as_json(self) -> dict:
        return {"layer": self.layer, "ids": self.ids.tolist(), "weights": self.weights.tolist(),
                "probs": self.probs.tolist()}


@dataclass(frozen=True)
class ExpertFacts:
    """A mixture-of-experts model's MLP parameters per token (weights and biases, counted from the
    config): each part over all layers, and `active` (what one token reads) beside `total`.

    router: config.router's rule (models/moe.py), renormalised: the k weights rescaled to add up to 1
    (norm_topk_prob; the sigmoid router then also scales them by routed_scaling_factor).
    routed: the E experts of every sparse layer (a token reads k of them: routed_active);
    router: every sparse layer's router (always read); shared: always-on shared experts (and their
    gates); dense: the MLPs of the layers without experts. expert_bytes: the routed experts'
    weights as the loaded model holds them (its dtype or GGUF blocks); a decode step reads
    read_share = k / E of them (read_bytes)."""

    experts: int
    experts_per_token: int
    sparse_layers: int
    dense_layers: int
    router: str
    renormalised: bool
    per_expert: int
    routed: int
    routed_active: int
    router_parameters: int
    shared: int
    dense: int
    total: int
    active: int
    read_share: float
    expert_bytes: int
    read_bytes: int


def routing_at(experts: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], position: int = -1,
               row: int = 0) -> list[LayerRouting]:
    """The router's choice at one position of a captured forward pass, per sparse layer in layer
    order (capture.experts: layer -> ids, weights (B, T, k), probs (B, T, E)); [] for a dense model.
    routing_at({1: (ids, w, p)})[0].ids == ids[0, -1]"""
    return [LayerRouting(layer, ids[row, position].cpu(), weights[row, position].cpu(), probs[row, position].cpu())
            for layer, (ids, weights, probs) in sorted(experts.items())]


def expert_facts(model: Model) -> ExpertFacts | None:
    """What a token costs in a mixture of experts, total vs active (None for a dense model).
    Qwen3-30B-A3B (48 sparse layers, 128 experts of 768, hidden 2048, k 8): routed 48 × 128 × 3 ×
    2048 × 768 = 29.0e9 parameters, of which a token reads 8 / 128 = 6.25% (1.81e9)."""
    config = model.config
    if not config.is_moe:
        return None
    hidden, e, k = config.hidden_size, config.num_experts, config.num_experts_per_tok
    sparse = config.mlp_types.count("sparse")
    dense = len(config.mlp_types) - sparse
    per_expert = _mlp(hidden, config.moe_intermediate_size, config.router_bias)
    router = sparse * (e * hidden + (e if config.router_bias else 0))
    shared = 0
    if config.shared_expert_intermediate_size:
        shared = sparse * (_mlp(hidden, config.shared_expert_intermediate_size, config.mlp_bias)
                           + (hidden if config.shared_expert_gate else 0))
    dense_mlp = dense * _mlp(hidden, config.intermediate_size, config.mlp_bias)
    routed, active = sparse * e * per_expert, sparse * k * per_expert
    always = router + shared + dense_mlp
    stored = _expert_bytes(model)
    return ExpertFacts(experts=e, experts_per_token=k, sparse_layers=sparse, dense_layers=dense, router=config.router,
                       renormalised=config.norm_topk_prob, per_expert=per_expert, routed=routed, routed_active=active,
                       router_parameters=router, shared=shared, dense=dense_mlp, total=routed + always,
                       active=active + always, read_share=k / e, expert_bytes=stored, read_bytes=stored * k // e)


def _mlp(hidden: int, inner: int, bias: bool) -> int:
    """A gated MLP's parameters: gate and up (inner × hidden each), down (hidden × inner), and biases.
    _mlp(64, 32, False) == 6144"""
    return 3 * hidden * inner + ((2 * inner + hidden) if bias else 0)


def _expert_bytes(model: Model) -> int:
    """Bytes of every sparse layer's routed experts as loaded (parameters and GGUF tile buffers)."""
    total = 0
    for module in model.modules():
        if isinstance(module, SparseMoE):
            tensors = [*module.experts.parameters(), *module.experts.buffers()]
            total += sum(t.numel() * t.element_size() for t in tensors)
    return total
