"""Attention infrastructure shared by the architectures: the mask and the attention call.

Every token carries its position; a position of -1 marks padding or an empty cache slot. The mask
follows from positions alone, so causal order, left padding, sliding windows and a truncated
cache all come out of one rule: query at position p sees key at position j when 0 <= j <= p
(and p - j < window for sliding-window layers).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from nexttok.models import kernels
from nexttok.models.cache import Cache

# Masks the fast attention kernels express without a tensor, for contiguous positions 0..S-1:
ALL = "all"  # one new token after the cache: it sees every key
CAUSAL = "causal"  # a whole fresh sequence: query i sees keys 0..i
TOKENS = "tokens"  # masks[TOKENS] (B, T): True where a token is real, False where padding (recurrent layers)


@dataclass(frozen=True)
class Ragged:
    """One new token per row, row r seeing keys spans[r] = (start, end) of its own. Attention
    runs row by row over exactly those keys, so a row's result does not depend on the other rows
    (a batch wider than the row would change the kernel's summation order in the last bits)."""

    spans: tuple[tuple[int, int], ...]


@dataclass
class AttentionCapture:
    """What a forward pass records for a viewer when one is passed in (capture=...). Computed apart
    from the fast kernels, so a pass without a capture pays nothing.

    Always, per attention layer (layers: which; a recurrent layer records none): the attention
    weights of the last query over every key (B, n_head, S); per mixture-of-experts layer, the
    router's choice for every position (experts[layer]: ids and weights (B, T, k), probs (B, T, E)).
    With full=True also, per layer: every query's weights (B, n_head, T, S), the queries, keys and
    values the weights came from (q (B, n_head, T, hd); k, v (B, n_head, S, hd), shared heads
    repeated), and the residual stream (B, T, hidden) after the embeddings and after each layer."""

    full: bool = False
    layers: list[int] = field(default_factory=list)  # the layer of each attention entry (recurrent layers have none)
    last_query: list[torch.Tensor] = field(default_factory=list)
    weights: list[torch.Tensor] = field(default_factory=list)
    qkv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)
    experts: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | str,
                  sinks: torch.Tensor | None = None) -> None:
        """Record softmax(q·k/√d) (over the keys and each head's sink, where there are sinks).
        q (B, n_head, T, hd), k and v (B, n_head, S, hd)."""
        if not self.full:
            q = q[:, :, -1:]
        weights = _softmax_weights(q.float(), k.float(), mask, sinks)  # (B, n_head, T', S)
        self.last_query.append(weights[:, :, -1])  # (B, n_head, S)
        if self.full:
            self.weights.append(weights)
            self.qkv.append((q.float(), k.float(), v.float()))

    def residual(self, x: torch.Tensor) -> None:
        """Record the residual stream (B, T, hidden) between layers (full captures only), in its dtype."""
        if self.full:
            self.hidden.append(x)

    def route(self, layer: int, routing, b: int, t: int) -> None:
        """Record a mixture-of-experts layer's routing (moe.Routing of B·T tokens)."""
        k = routing.ids.shape[-1]
        self.experts[layer] = (routing.ids.view(b, t, k), routing.weights.view(b, t, k).float(),
                               routing.probs.view(b, t, -1).float())


def _softmax_weights(q: torch.Tensor, k: torch.Tensor, mask, sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax(q·kᵀ/√d) under mask (B, H, T, S) for the last T queries; with sinks (H,), each
    head's sink logit joins the softmax and its share is dropped (the weights then sum to < 1)."""
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5  # (B, H, T, S)
    if isinstance(mask, str):  # ALL or CAUSAL: the T queries are the last T positions
        t, s = scores.shape[-2:]
        allowed = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)  # (T, S)
        scores = scores.masked_fill(~allowed, float("-inf"))
    else:
        scores = scores.masked_fill(~mask[:, :, -scores.shape[-2]:], float("-inf"))
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    return torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]


class _Traced:
    """What a layer is given as its cache and masks when torch.compile traces the decode step
    (compiled.py): attention then goes through the opaque op below, which finds the real cache and
    mask in STEP. masks[w] is itself, so a layer's code reads the same either way."""

    def __getitem__(self, window):
        return self


TRACED = _Traced()
STEP = threading.local()  # cache, mask: the current layer's, while a compiled step runs


@torch.library.custom_op("nexttok::cached_attention", mutates_args=())
def _cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Store k, v in STEP.cache and attend over everything cached, under STEP.mask. Opaque to the
    compiler: its output has q's shape whatever the cache holds, so the compiled graph keeps
    static shapes; the cache is written here, outside the graph, and nothing in it reads it.
    Contiguous, as the fake below tells the compiler (the eager path needs no copy)."""
    return attend_cached(q, k, v, STEP.layer, STEP.mask, STEP.cache).contiguous()


@_cached_attention.register_fake
def _(q, k, v):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def attend_cached(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, mask, cache: Cache | None,
                  capture: AttentionCapture | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's attention: this call's k, v (B, n_kv, T, hd) stored in the cache (when there is
    one), q attending over all of them in the cache's dtype (storage_dtype); (B, n_head, T, hd)
    back in q's dtype. sinks (n_head,): attention sinks (gpt-oss), see attend."""
    if cache is TRACED:
        assert sinks is None, "the compiled step has no attention sinks"
        return torch.ops.nexttok.cached_attention(q, k, v)
    if cache is not None:
        k, v = cache.update_and_fetch(layer, k, v)  # (B, n_kv, S, hd)
    if capture is not None:
        capture.layers.append(layer)
    return attend(q.to(k.dtype), k, v, mask, capture, sinks).to(q.dtype)


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Boolean mask (B, 1, T, S), True where attention is allowed.

    q_pos (B, T) and k_pos (B, S) hold positions (-1 = padding). A padding query may see every
    key (its output is never used) so no row is all False, which would make softmax NaN.
    attention_mask([[0, 1]], [[0, 1]]) -> [[[[True, False], [True, True]]]]
    """
    q = q_pos[:, :, None]  # (B, T, 1)
    k = k_pos[:, None, :]  # (B, 1, S)
    allowed = (k >= 0) & (k <= q)
    if window is not None:
        allowed &= (q - k) < window
    allowed |= q < 0
    return allowed[:, None]  # (B, 1, T, S)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | str | Ragged,
    capture: AttentionCapture | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention with grouped-query heads.

    q (B, n_head, T, head_dim); k, v (B, n_kv_head, S, head_dim); returns (B, n_head, T, head_dim).
    mask: a boolean tensor (B, 1, T, S), or ALL / CAUSAL (no tensor: the fast kernels' own cases).
    sinks (n_head,): a logit per head that joins every softmax as one more key with no value, so
    a query may give part of its attention to nothing (gpt-oss).
    capture, when given, records the weights of the last query over all keys.
    """
    n_rep = q.shape[1] // k.shape[1]
    if _one_query(q, k, mask):  # decode: our kernel reads the cache's rows in place
        if mask == ALL:
            out = kernels.attend(q, k, v, sinks)
        else:
            out = torch.cat([kernels.attend(q[r : r + 1], k[r : r + 1, :, a:b], v[r : r + 1, :, a:b], sinks)
                             for r, (a, b) in enumerate(mask.spans)])
        if capture is not None and isinstance(mask, Ragged):
            mask = _span_mask(mask, k.shape[2], q.device)
    elif sinks is not None:  # no fused kernel takes sinks: the softmax written out
        if isinstance(mask, Ragged):
            mask = _span_mask(mask, k.shape[2], q.device)
        kh, vh = (k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)) if n_rep > 1 else (k, v)
        out = (_softmax_weights(q.float(), kh.float(), mask, sinks) @ vh.float()).to(q.dtype)
    elif isinstance(mask, Ragged):
        out = torch.cat([F.scaled_dot_product_attention(q[r : r + 1], k[r : r + 1, :, a:b], v[r : r + 1, :, a:b],
                                                        enable_gqa=n_rep > 1)
                         for r, (a, b) in enumerate(mask.spans)])
        if capture is not None:
            mask = _span_mask(mask, k.shape[2], q.device)
    elif isinstance(mask, str):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=mask == CAUSAL, enable_gqa=n_rep > 1)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=n_rep > 1)
    if capture is not None:
        k, v = (k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)) if n_rep > 1 else (k, v)
        capture.attention(q, k, v, mask, sinks)  # k, v (B, n_head, S, hd)
    return out


def _one_query(q: torch.Tensor, k: torch.Tensor, mask) -> bool:
    """One new query per row over keys it sees all of (ALL, or a Ragged row's span), float32 on
    the CPU: what kernels.attend runs (no key span may be empty)."""
    if q.shape[2] != 1 or not kernels.takes(q) or k.dtype != torch.float32:
        return False
    return mask == ALL or (isinstance(mask, Ragged) and all(b > a for a, b in mask.spans))


def _span_mask(ragged: Ragged, width: int, device) -> torch.Tensor:
    """The boolean mask (B, 1, 1, S) equal to a Ragged one."""
    keys = torch.arange(width, device=device)
    starts = torch.tensor([a for a, _ in ragged.spans], device=device)[:, None]
    ends = torch.tensor([b for _, b in ragged.spans], device=device)[:, None]
    return ((keys >= starts) & (keys < ends))[:, None, None]


def positions_for(ids: torch.Tensor, cache: Cache | None, positions: torch.Tensor | None,
                  limit: int) -> torch.Tensor:
    """Positions (B, T) of this call's tokens: given, or continuing after what the cache holds.

    positions_for(ids of shape (1, 3), cache holding 5 slots, None, 1024) -> [[5, 6, 7]]
    """
    b, t = ids.shape
    if positions is None:
        start = cache.offset if cache is not None else 0
        if start + t > limit:
            raise ValueError(f"positions {start}..{start + t - 1} exceed the model's context of {limit}")
        return torch.arange(start, start + t, device=ids.device).expand(b, t)
    if positions.shape != ids.shape:
        raise ValueError(f"positions shape {tuple(positions.shape)} != ids shape {tuple(ids.shape)}")
    if int(positions.max()) >= limit:
        raise ValueError(f"position {int(positions.max())} exceeds the model's context of {limit}")
    return positions


def masks_for(q_pos: torch.Tensor, k_pos: torch.Tensor, windows: set[int | None], contiguous: bool,
              cache: Cache | None = None) -> dict:
    """One mask per distinct window size among the layers: {None: full, 4096: sliding, ...}.

    contiguous: every row's keys are positions 0..S-1 in order (no padding, no holes), so decode
    and a fresh prompt need no mask tensor while the window does not cut anything.
    cache.spans: for one token per row, the keys [start, end) each row sees (a batch of sequences
    of different lengths, each stored from slot 0): attention goes row by row (Ragged); a cache
    keeping a window's keys in buffers of its own gives those rows' spans there (window_spans).
    """
    spans = cache.spans if cache is not None else None
    t = q_pos.shape[1]
    masks: dict = {}
    for w in windows:
        start = cache.key_start(w) if w is not None and hasattr(cache, "key_start") else 0  # windowed: kept from here
        s = k_pos.shape[1] - start
        if spans is not None and t == 1:
            kept = cache.window_spans(w) if w is not None and hasattr(cache, "window_spans") else None
            masks[w] = Ragged(kept if kept is not None else tuple((max(a, b - w) if w else a, b) for a, b in spans))
        elif contiguous and (w is None or s <= w) and t in (1, s):
            masks[w] = ALL if t == 1 else CAUSAL
        else:
            masks[w] = attention_mask(q_pos, k_pos[:, start:], w)
    return masks


def keys_for(q_pos: torch.Tensor, cache: Cache | None, explicit: bool) -> tuple[torch.Tensor, bool]:
    """Positions of every key (B, S) after this call, and whether they are contiguous from 0."""
    if cache is None:
        return q_pos, not explicit
    contiguous = cache.contiguous and not explicit
    return cache.append_positions(q_pos, contiguous=not explicit), contiguous
