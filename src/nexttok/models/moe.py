"""Mixture of experts: in place of one MLP, E expert MLPs, of which a router picks k per token.

    x ─router→ logits (E) ─scores, top k→ ids (k), weights (k)
      ─Σ_j weights_j · expert_{ids_j}(x)→ (+ a shared expert, always on) → y

Only the k chosen experts' weights are read for a token, which is why a 30B-parameter model with
3B active parameters runs at about a 3B model's speed on a CPU. The routers, as the families
define them (config.router):

    softmax        p = softmax(logits); the k largest p; divided by their sum where norm_topk_prob
                   (Qwen2/3-MoE, OLMoE; Mixtral always renormalises)
    topk_softmax   the k largest logits (a bias added first: gpt-oss), softmax over those k
                   (gpt-oss, Granite-MoE)
    sigmoid        s = sigmoid(logits); the experts are chosen by s + e_score_correction_bias,
                   among the topk_group best of n_group groups (a group's score: its best two);
                   weights are the chosen s, renormalised where norm_topk_prob, times
                   routed_scaling_factor (GLM-4-MoE, DeepSeek-V3 style)

Experts hold every expert's weights stacked: gate_up_proj (E, 2 inner, hidden) with each
expert's gate rows then its up rows, down_proj (E, hidden, inner). Checkpoints mostly keep one
tensor per expert (experts.N.gate_proj.weight, ...), which the loader stacks (checkpoint_parts);
GGUF files keep three 3-D tensors, which stay in their block types (block_quant.BlockExperts).

A forward call groups its tokens by expert, so each expert's weights are read once per call
(prefill), and a decode step reads only its k experts. capture (attention.AttentionCapture)
records the router's choice per layer for a viewer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nexttok.models.config import ConfigError, ModelConfig, sparse_layers
from nexttok.models.llama import MLP, swiglu


@dataclass(frozen=True)
class Routing:
    """A router's decision for N tokens: ids (N, k) of the experts, weights (N, k) float32 their
    outputs are summed with, probs (N, E) float32 every expert's score (softmax or sigmoid)."""

    ids: torch.Tensor
    weights: torch.Tensor
    probs: torch.Tensor


class Router(nn.Module):
    """logits = x · Wᵀ (+ bias), then config.router's rule (see the module docstring)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        e = config.num_experts
        self.kind, self.k, self.norm = config.router, config.num_experts_per_tok, config.norm_topk_prob
        self.groups, self.top_groups, self.scale = config.n_group, config.topk_group, config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(e, config.hidden_size))
        self.bias = nn.Parameter(torch.empty(e)) if config.router_bias else None
        self.e_score_correction_bias = nn.Parameter(torch.empty(e)) if self.kind == "sigmoid" else None

    def forward(self, x: torch.Tensor) -> Routing:
        """x (N, hidden) -> the Routing of its N tokens."""
        logits = F.linear(x.float(), self.weight.float(), None if self.bias is None else self.bias.float())  # (N, E)
        if self.kind == "topk_softmax":
            top, ids = logits.topk(self.k, dim=-1)
            return Routing(ids, torch.softmax(top, dim=-1), torch.softmax(logits, dim=-1))
        if self.kind == "sigmoid":
            return self._sigmoid(logits)
        probs = torch.softmax(logits, dim=-1)
        weights, ids = probs.topk(self.k, dim=-1)
        if self.norm:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return Routing(ids, weights, probs)

    def _sigmoid(self, logits: torch.Tensor) -> Routing:
        scores = logits.sigmoid()  # (N, E)
        choice = scores + self.e_score_correction_bias.float()
        if self.groups > 1:  # only the experts of the best topk_group groups are eligible
            n, e = choice.shape
            grouped = choice.view(n, self.groups, e // self.groups)  # (N, G, E/G)
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (N, G)
            best = group_scores.topk(self.top_groups, dim=-1, sorted=False).indices
            keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)  # (N, G)
            choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(n, e)
        ids = choice.topk(self.k, dim=-1, sorted=False).indices
        weights = scores.gather(1, ids)
        if self.norm:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return Routing(ids, weights * self.scale, scores)


def activation(config: ModelConfig):
    """The experts' gated activation of h = [gate | up] (..., 2 inner) -> (..., inner)."""
    if config.hidden_act == "swiglu_oai":
        alpha, limit = config.swiglu_alpha, config.swiglu_limit

        def clamped_swiglu(h: torch.Tensor) -> torch.Tensor:
            """gpt-oss: gate clamped above at limit, up to ±limit, gate·σ(alpha·gate)·(up + 1)."""
            gate, up = h.chunk(2, dim=-1)
            gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
            return gate * torch.sigmoid(gate * alpha) * (up + 1)

        return clamped_swiglu
    if config.hidden_act == "gelu_pytorch_tanh":
        return geglu
    return swiglu


def geglu(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up for gate_up = [gate | up] (Gemma 4's experts)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


class Experts(nn.Module):
    """E expert MLPs down(act(gate_up(x))), weights stacked (float: the checkpoint's values).
    gate_up_proj_bias and down_proj_bias where config.router_bias (gpt-oss)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        e, hidden, inner = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts, self.inner = e, inner
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * inner, hidden))
        self.down_proj = nn.Parameter(torch.empty(e, hidden, inner))
        bias = config.router_bias
        self.gate_up_proj_bias = nn.Parameter(torch.empty(e, 2 * inner)) if bias else None
        self.down_proj_bias = nn.Parameter(torch.empty(e, hidden)) if bias else None
        self.act = activation(config)
        self.activation = (config.hidden_act, config.swiglu_alpha, config.swiglu_limit)  # for block_quant.BlockExperts

    def checkpoint_parts(self, leaf: str) -> list[tuple[str, tuple[int, ...]]]:
        """The per-expert checkpoint tensors (names under this module, shapes) that stacked in order
        make parameter `leaf`: "0.gate_proj.weight", "0.up_proj.weight", "1.gate_proj.weight", ..."""
        hidden = self.down_proj.shape[1]
        parts = {"gate_up_proj": (("gate_proj", "up_proj"), (self.inner, hidden), "weight"),
                 "down_proj": (("down_proj",), (hidden, self.inner), "weight"),
                 "gate_up_proj_bias": (("gate_proj", "up_proj"), (self.inner,), "bias"),
                 "down_proj_bias": (("down_proj",), (hidden,), "bias")}
        names, shape, kind = parts[leaf]
        return [(f"{e}.{name}.{kind}", shape) for e in range(self.num_experts) for name in names]

    def forward(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """x (N, hidden) -> (N, hidden): Σ_j weights_j · expert_{ids_j}(x), each expert run once on
        all of its tokens (in expert order, as HF transformers sums them)."""
        n, k = routing.ids.shape
        flat = routing.ids.reshape(-1)
        order = flat.argsort(stable=True)  # slots grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        weights = routing.weights.reshape(-1, 1)
        out = torch.zeros_like(x)
        start = 0
        for e, count in enumerate(counts):
            if not count:
                continue
            slots = order[start : start + count]
            start += count
            tokens = slots // k
            h = self.act(F.linear(x[tokens], self.gate_up_proj[e], self._bias(self.gate_up_proj_bias, e)))
            y = F.linear(h, self.down_proj[e], self._bias(self.down_proj_bias, e))
            out.index_add_(0, tokens, y * weights[slots].to(y.dtype))
        return out

    @staticmethod
    def _bias(bias: torch.Tensor | None, e: int) -> torch.Tensor | None:
        return None if bias is None else bias[e]


class SparseMoE(nn.Module):
    """A layer's mixture of experts: gate (the router), experts, and where the family has one a
    shared expert every token goes through (its output times sigmoid(x · w) where
    shared_expert_gate: Qwen2-MoE)."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.gate = Router(config)
        self.experts = Experts(config)
        shared = config.shared_expert_intermediate_size
        self.shared_expert = MLP(config, inner=shared) if shared else None
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False) if config.shared_expert_gate else None

    def forward(self, x: torch.Tensor, capture=None) -> torch.Tensor:
        """x (B, T, hidden) -> (B, T, hidden); capture, where given, records the routing."""
        b, t, hidden = x.shape
        flat = x.reshape(-1, hidden)
        routing = self.gate(flat)
        if capture is not None:
            capture.route(self.layer_idx, routing, b, t)
        y = self.experts(flat, routing)
        if self.shared_expert is not None:
            shared = self.shared_expert(flat)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(flat)) * shared
            y = y + shared
        return y.view(b, t, hidden)


def fields(hf: dict, *, experts: str = "num_experts", inner: str | None = "moe_intermediate_size",
           router: str = "softmax", norm: bool | None = None) -> dict:
    """The mixture-of-experts fields every MoE family reads, under its own key names: the number of
    experts (`experts`, or num_local_experts, as transformers 5 writes every family's), each one's
    inner width (`inner`; None: intermediate_size), how many a token takes, the router's rule, and
    norm_topk_prob (`norm`: the family's fixed choice; None: the config's, default False). Which
    layers are sparse is each family's to add."""
    count, k = hf.get(experts, hf.get("num_local_experts")), hf.get("num_experts_per_tok")
    if type(count) is not int or count <= 0:
        raise ConfigError(f"{experts} must be a positive integer, got {count!r}")
    return dict(num_experts=count, num_experts_per_tok=k, router=router,
                moe_intermediate_size=hf[inner] if inner else hf["intermediate_size"],
                norm_topk_prob=bool(hf.get("norm_topk_prob", False)) if norm is None else norm,
                mlp_types=sparse_layers(hf["num_hidden_layers"]))


# llama.cpp's names of a mixture of experts' tensors (per block), and of a shared expert's
GGUF_TENSORS = {
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.up_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.down_proj.weight",
}
SHARED_GGUF_TENSORS = {
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}


def gguf_config(meta, experts: str = "num_experts") -> dict:
    """The experts' config.json keys from llama.cpp's metadata (expert_count, expert_used_count,
    expert_feed_forward_length where the family writes it)."""
    out = {experts: meta.key("expert_count"), "num_experts_per_tok": meta.key("expert_used_count")}
    if meta.get("expert_feed_forward_length") is not None:
        out["moe_intermediate_size"] = meta.get("expert_feed_forward_length")
    return out


def gguf_metadata(config: ModelConfig) -> dict:
    """gguf_config's inverse."""
    return {"expert_count": config.num_experts, "expert_used_count": config.num_experts_per_tok,
            "expert_feed_forward_length": config.moe_intermediate_size}
