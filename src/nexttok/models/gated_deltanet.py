"""Gated DeltaNet: the linear attention of Qwen3-Next and Qwen3.5, a recurrent layer.

    q, k, v = SiLU(conv(x·W_qkv))         a causal depthwise convolution over the last conv_kernel tokens
    q, k    = l2-normalised per head; q / √d_k
    g       = -exp(A_log) · softplus(x·W_a + dt_bias)      the decay, in log space (one per value head)
    β       = sigmoid(x·W_b)                               how much of each token the state takes in
    S_t     = e^{g_t} S_{t-1} + k_t (β_t (v_t - k_tᵀ e^{g_t} S_{t-1}))ᵀ      the delta rule
    o_t     = S_tᵀ q_t
    y       = RMSNorm(o) · SiLU(x·W_z) ─out_proj→

Each value head keeps a state S (d_k, d_v): a memory that maps keys to values, decayed a little at
every token and corrected where it mispredicts v_t (the delta rule), so the layer's whole context is
(value heads, d_k, d_v) numbers whatever the context's length, plus the convolution's last
conv_kernel - 1 inputs. Key heads are fewer than value heads; each serves value heads / key heads
of them (grouped, as HF orders them, or tiled: config.linear_value_heads_tiled).

A decode step is the recurrence itself (a few batched matmuls over every head). A prefill runs
the same recurrence in chunks of CHUNK tokens, as HF's torch_chunk_gated_delta_rule does: within a
chunk the delta rule's corrections are one triangular solve (the UT transform), and the state is
carried from chunk to chunk. Padding (masks[TOKENS]) enters nothing: its input is zeroed, as HF
zeroes it, and its decay and β are 0, so the state passes a padded token unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nexttok.models.attention import TOKENS
from nexttok.models.config import ModelConfig
from nexttok.models.fused import FusedLinear

CHUNK = 64  # HF's chunk_size


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / ‖x‖ over the last dimension, as HF's (and the FLA library's) l2norm: x·rsqrt(Σx² + eps)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def delta_step(q, k, v, g, beta, state: torch.Tensor) -> torch.Tensor:
    """One token of the gated delta rule for every row and head: q, k (B, H, 1, d_k), v (B, H, 1, d_v),
    g, beta (B, H, 1), all float32; state (B, H, d_k, d_v) updated in place. Returns o (B, H, 1, d_v)."""
    state.mul_(g.exp()[..., None])  # (B, H, 1, 1): the decay
    delta = (v - k @ state) * beta[..., None]  # what the state mispredicts for k, times β
    state.add_(k.transpose(-1, -2) @ delta)  # (B, H, d_k, 1) @ (B, H, 1, d_v)
    return q @ state


def delta_chunked(q, k, v, g, beta, state: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """The gated delta rule over T tokens in chunks (HF's torch_chunk_gated_delta_rule): q, k
    (B, H, T, d_k), v (B, H, T, d_v), g, beta (B, H, T), float32; state (B, H, d_k, d_v) updated in
    place. Returns o (B, H, T, d_v). The tail chunk is padded with tokens that change nothing (β 0, g 0)."""
    t = q.shape[2]
    pad = -t % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    q, k, v = (x.unflatten(2, (-1, chunk)) for x in (q, k, v))  # (B, H, N, C, d)
    g, beta = g.unflatten(2, (-1, chunk)).cumsum(-1), beta.unflatten(2, (-1, chunk))  # g: decay since chunk start
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(upper, float("-inf")).exp()  # (B, H, N, C, C): i from j
    # the UT transform: (I + strictly_lower(β k kᵀ ⊙ decay))⁻¹ turns a chunk's delta rule into matmuls
    system = (k_beta @ k.transpose(-1, -2)) * decay
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * g.exp()[..., None], upper=False, unitriangular=True)
    inner = (q @ k.transpose(-1, -2)) * decay  # attention within the chunk (causal)
    q_decayed = q * g.exp()[..., None]
    k_decayed = k * (g[..., -1:] - g).exp()[..., None]  # each key's decay until the chunk's end
    chunk_decay = g[..., -1].exp()[..., None, None]  # (B, H, N, 1, 1)
    out = torch.empty_like(v)
    s = state
    for i in range(q.shape[2]):
        v_new = u[:, :, i] - w[:, :, i] @ s  # the chunk's corrections given the state before it
        out[:, :, i] = q_decayed[:, :, i] @ s + inner[:, :, i] @ v_new
        s = s * chunk_decay[:, :, i] + k_decayed[:, :, i].transpose(-1, -2) @ v_new
    state.copy_(s)
    return out.flatten(2, 3)[:, :, :t]


class DepthwiseConv(nn.Module):
    """A depthwise convolution's weight (channels, kernel), as llama.cpp stores it (HF's Conv1d has
    (channels, 1, kernel): the family's transforms squeeze it). No bias."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, kernel))


class GatedRMSNorm(nn.Module):
    """RMSNorm of each value head's output (its weight as is, not zero-centred), times SiLU(z)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = self.weight * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (y * F.silu(z.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """A "linear_attention" layer. in_proj_qkvz's rows: q, k, v (each head after head), then z.
    in_proj_ba's: b then a, interleaved per key head where `interleaved` (Qwen3-Next's checkpoints and
    llama.cpp's files), else all of b then all of a (Qwen3.5 keeps them apart: one group)."""

    def __init__(self, config: ModelConfig, layer_idx: int, interleaved: bool):
        super().__init__()
        self.nk, self.nv = config.linear_num_key_heads, config.linear_num_value_heads
        self.layer_idx, self.kernel, self.ba_groups = layer_idx, config.conv_kernel, self.nk if interleaved else 1
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        self.tiled = config.linear_value_heads_tiled
        key_dim, value_dim = self.nk * self.dk, self.nv * self.dv
        self.conv_dim, self.value_dim = 2 * key_dim + value_dim, value_dim
        hidden = config.hidden_size
        self.in_proj_qkvz = FusedLinear(hidden, {"in_proj_qkv": self.conv_dim, "in_proj_z": value_dim}, False)
        if interleaved:
            self.in_proj_ba = nn.Linear(hidden, 2 * self.nv, bias=False)
        else:
            self.in_proj_ba = FusedLinear(hidden, {"in_proj_b": self.nv, "in_proj_a": self.nv}, False)
        self.conv1d = DepthwiseConv(self.conv_dim, self.kernel)
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.zeros(self.nv))
        self.norm = GatedRMSNorm(self.dv, config.norm_eps)
        self.out_proj = nn.Linear(value_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, masks: dict, cache) -> torch.Tensor:
        b, t, _ = x.shape
        tokens = masks.get(TOKENS)
        padded = tokens is not None and not bool(tokens.all())
        if padded:
            x = x * tokens[..., None].to(x.dtype)  # padding takes no part (HF zeroes it too)
        qkv, z = self.in_proj_qkvz(x).split([self.conv_dim, self.value_dim], dim=-1)
        ba = self.in_proj_ba(x).view(b, t, self.ba_groups, 2, -1)  # (B, T, groups, 2, nv / groups)
        beta = ba[:, :, :, 0].reshape(b, t, self.nv).sigmoid().float()
        g = -self.A_log.float().exp() * F.softplus(ba[:, :, :, 1].reshape(b, t, self.nv).float() + self.dt_bias)
        if padded:  # a padded token leaves the state as it was: no decay, nothing taken in
            beta, g = beta * tokens[..., None], g * tokens[..., None]
        q, k, v = self.heads(self.convolve(qkv, cache))
        state = self.state(cache, b, x.device)
        rule = delta_step if t == 1 else delta_chunked
        o = rule(q, k, v, g.transpose(1, 2), beta.transpose(1, 2), state)  # (B, nv, T, dv)
        y = self.norm(o.transpose(1, 2).to(x.dtype), z.view(b, t, self.nv, self.dv))
        return self.out_proj(y.reshape(b, t, self.value_dim))

    def convolve(self, qkv: torch.Tensor, cache) -> torch.Tensor:
        """SiLU of the causal depthwise convolution of qkv (B, T, conv_dim) over its last `kernel`
        inputs; the cache keeps the last kernel - 1 (B, conv_dim, kernel - 1), oldest first."""
        x = qkv.transpose(1, 2)  # (B, conv_dim, T)
        past = self.kernel - 1
        if cache is None:
            window = F.pad(x, (past, 0))  # nothing before the first token
        else:
            state = cache.state(self.layer_idx, "conv", (self.conv_dim, past), x.dtype)
            window = torch.cat((state, x), dim=-1)
            state.copy_(window[..., -past:])
        # each output: its window of `kernel` inputs times the weights, summed (F.conv1d's depthwise CPU
        # kernel takes ~70 ms a call here, for what is 4 multiply-adds per channel)
        y = (window.unfold(-1, self.kernel, 1) * self.conv1d.weight[:, None]).sum(-1)  # (B, conv_dim, T)
        return F.silu(y).transpose(1, 2)

    def heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (B, nv, T, d_k) l2-normed, q scaled by 1/√d_k, each key head repeated for its value
        heads; v (B, nv, T, d_v); all float32."""
        b, t, _ = mixed.shape
        q, k, v = mixed.float().split([self.nk * self.dk, self.nk * self.dk, self.value_dim], dim=-1)
        q, k = (l2norm(x.view(b, t, self.nk, self.dk)) for x in (q, k))
        r = self.nv // self.nk
        if r > 1:
            q, k = ((x.repeat(1, 1, r, 1) if self.tiled else x.repeat_interleave(r, dim=2)) for x in (q, k))
        q = q * self.dk**-0.5
        return q.transpose(1, 2), k.transpose(1, 2), v.view(b, t, self.nv, self.dv).transpose(1, 2)

    def state(self, cache, batch: int, device) -> torch.Tensor:
        """The delta rule's state (B, nv, d_k, d_v), float32 whatever the weights (as HF keeps it)."""
        shape = (self.nv, self.dk, self.dv)
        if cache is None:
            return torch.zeros((batch, *shape), dtype=torch.float32, device=device)
        return cache.state(self.layer_idx, "delta", shape, torch.float32)
