"""The decode step of a GGUF model in one C++ call per layer (kernels' DecodeLayer, csrc/decode.cpp).

An eager decode step of the default model runs ~25 small torch operations per layer around its four
matmuls (norms, views, RoPE, the cache write, attention, residual adds): ~3 us each to dispatch and
allocate, more than the layer's matmuls themselves. A DecodeLayer holds one layer's weights and runs
those same steps on scratch rows, with the same row functions the separate kernels use, so its
output equals the eager layer's bit for bit (tests/test_fused_decode.py): the model files stay the
definition, and this is how their layers run when nothing needs to look inside them.

It takes the layers that are exactly llama.py's (DecoderLayer, Attention, MLP, RMSNorm, in float32
on the CPU with every linear a BlockLinear): Llama, SmolLM, Qwen2, Mistral, and Qwen3's per-head
q/k norms. It runs a step of one new token per row with nothing captured, into a KVCache whose
rows all see their whole past (no padding) or the server's batch of slots (each row its own span
of keys); any other layer (a window a KVCache's mask cuts, keys kept for a window only, a mixture
of experts, a recurrent layer, Gemma's norms) runs eagerly in the same step, and any other step
(prefill, a viewer's capture, padding) runs eagerly throughout.
"""

from __future__ import annotations

import torch
from torch import nn

from nexttok.models import kernels, llama
from nexttok.models.attention import ALL, Ragged
from nexttok.models.block_quant import BlockEmbedding, BlockLinear
from nexttok.models.cache import KVCache
from nexttok.models.slot_cache import BatchView


def _linear(module: nn.Module):
    return kernels.load().DecodeLinear([getattr(module, f"tiles{i}") for i in range(len(module.types))], module.types,
                                       module.part_rows, None if module.bias is None else module.bias.detach(),
                                       module.in_features)


def _same(obj: object, cls: type, *methods: str) -> bool:
    """obj is a cls (or a subclass that changes none of `methods`)."""
    return isinstance(obj, cls) and all(getattr(type(obj), m) is getattr(cls, m) for m in methods)


def layer_plan(block: nn.Module, isa: int):
    """A DecodeLayer for one block, or None where the block is not exactly llama.py's layer."""
    attn, mlp = getattr(block, "self_attn", None), getattr(block, "mlp", None)
    if not (_same(block, llama.DecoderLayer, "forward") and _same(attn, llama.Attention, "forward", "rotate", "normed")
            and _same(mlp, llama.MLP, "forward") and not block.sparse and block.scale == 1.0):
        return None
    norms = [block.input_layernorm, block.post_attention_layernorm]
    if attn.qk_norm == "head":
        norms += [attn.q_norm, attn.k_norm]
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    if (attn.qk_norm not in (None, "head") or not attn.use_rope or attn.rotary_dim != attn.head_dim
            or attn.q_scale != 1.0 or attn.sinks is not None
            or not all(_same(n, llama.RMSNorm, "forward") and n.weight.dtype == torch.float32 for n in norms)
            or len({n.eps for n in norms}) != 1 or not all(type(m) is BlockLinear for m in linears)):
        return None
    q_norm, k_norm = (attn.q_norm.weight.detach(), attn.k_norm.weight.detach()) if attn.qk_norm else (None, None)
    return kernels.load().DecodeLayer(
        block.input_layernorm.weight.detach(), block.post_attention_layernorm.weight.detach(), norms[0].eps,
        *[_linear(m) for m in linears[:1]], q_norm, k_norm, *[_linear(m) for m in linears[1:]],
        attn.n_head, attn.n_kv_head, attn.head_dim, kernels.SILU_MUL, isa)


class FusedDecode:
    """The planned layers of one model (None: that layer runs eagerly)."""

    def __init__(self, layers: list):
        self.layers = layers
        self.windows: list[int | None] = []
        self.lean = False  # fuse_decode: whether step may take a model's plain decode step whole
        self.head = None  # fuse_decode: the final norm and lm_head (kernels' DecodeHead), where plain
        self.table = None  # and the token table (kernels' DecodeTable), where a float32 BlockEmbedding

    def step(self, model: nn.Module, ids: torch.Tensor, cache, logits: bool = False) -> torch.Tensor | None:
        """The residual stream (B, 1, hidden) of a decode step that needs none of Decoder.stream's
        general steps, or None. When every layer is planned, none has a window and the model embeds
        and rotates as Llama does (self.lean), one new token per row into a KVCache whose rows all
        hold positions 0..offset-1 has the offset for its position, ALL for every mask, one row of
        the RoPE tables for cos and sin: the step is then one decode_layers call with no positions,
        masks or table lookups made around it (~0.3 ms of Python a token, a twentieth of the
        default model's step). The cache is left as stream leaves it, the logits are the same.
        logits: the step's logits (B, 1, vocab) instead, through self.head in the same call (None
        where there is none): the final norm and lm_head's Python took ~0.3 ms of a 1.5B model's
        step, on caches the weights' stream had emptied."""
        if not (self.lean and type(cache) is KVCache and self.takes(ids, cache, None) and cache.contiguous
                and not cache.windows and cache.offset < model.config.max_position_embeddings
                and (self.head is not None or not logits)):
            return None
        b, offset = ids.shape[0], cache.offset
        cache.append_positions(torch.full((b, 1), offset, dtype=torch.long), contiguous=True)
        if logits and self.table is not None and ids.dtype == torch.long:  # the inputs made in C++ too
            return kernels.load().decode_tokens(self.layers, self.table, self.head, ids.reshape(b), model.rope_cos,
                                                model.rope_sin, offset, *_stores(cache, 0, len(self.layers)))
        h = model.embed(ids).reshape(b, -1).contiguous()
        cos, sin = (t[offset:offset + 1].expand(b, -1).contiguous() for t in (model.rope_cos, model.rope_sin))
        store, slot, ends = _rows(cache)
        if logits:
            stores = _stores(store, 0, len(self.layers))
            return kernels.load().decode_logits(self.layers, self.head, h, cos, sin, *stores, slot, _starts(ALL, b),
                                                ends).view(b, 1, -1)
        return self._fused(0, len(self.layers), h, cos, sin, store, slot, _starts(ALL, b), ends).view(b, 1, -1)

    @staticmethod
    def takes(ids: torch.Tensor, cache, capture) -> bool:
        """A decode step (one new token per row) into a float32 KVCache or the server's batch of
        slots, nothing captured, no autograd."""
        return (ids.shape[1] == 1 and capture is None and not torch.is_grad_enabled()
                and type(cache) in (KVCache, BatchView) and _store(cache).dtype == torch.float32)

    def run(self, blocks: nn.ModuleList, x: torch.Tensor, extra: tuple, masks: dict, cache) -> torch.Tensor:
        """x (B, 1, hidden) through every block; extra: RoPE's cos and sin (B, 1, 1, D/2). Each run of
        consecutive planned layers under one mask is one C++ call (kernels' decode_layers)."""
        b, _, hidden = x.shape
        cos, sin = (t.reshape(b, -1).contiguous() for t in extra[:2])
        store, slot, ends = _rows(cache)
        starts = {w: _starts(m, b) for w, m in masks.items()}  # None: that window's layers run eagerly
        h = x.reshape(b, hidden).contiguous()
        for lo, hi, first in self._runs(cache, store, starts):
            if first is None:
                for i in range(lo, hi):
                    h = blocks[i](h.view(b, 1, hidden), *extra, masks, cache, None).reshape(b, hidden).contiguous()
                continue
            h = self._fused(lo, hi, h, cos, sin, store, slot, first, ends)
        return h.view(b, 1, hidden)

    def _fused(self, lo: int, hi: int, h: torch.Tensor, cos, sin, store: KVCache, slot, first, ends) -> torch.Tensor:
        """h (B, hidden) through the planned layers lo..hi-1 in one C++ call (kernels' decode_layers),
        each reading its keys at its (group, row) of the store's buffers."""
        return kernels.load().decode_layers(self.layers[lo:hi], h, cos, sin, *_stores(store, lo, hi), slot, first,
                                            ends)

    def _runs(self, cache, store: KVCache, starts: dict) -> list[list]:
        """[first layer, end, first keys or None (eager)] of each run of layers that go alike: planned
        ones under the same mask together, the rest eagerly."""
        runs: list[list] = []
        for i, op in enumerate(self.layers):
            first = None if op is None or _windowed(cache, store, i) else starts[self.windows[i]]
            if runs and runs[-1][2] is first:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1, first])
        return runs


def _stores(store: KVCache, lo: int, hi: int) -> tuple[list, list, list[int]]:
    """The key and value buffers of layers lo..hi-1 and each layer's row in them."""
    where = store.slots_of[lo:hi]
    return [store.groups[g][0] for g, _ in where], [store.groups[g][1] for g, _ in where], [r for _, r in where]


def head_plan(model: nn.Module, isa: int):
    """A DecodeHead for a model whose head is exactly llama.py's (the final RMSNorm in float32, a
    BlockLinear lm_head, logits not scaled), or None."""
    norm, lm_head = getattr(model, "norm", None), getattr(model, "lm_head", None)
    if not (_same(model, llama.Llama, "forward", "head", "final_norm") and model.config.logits_scaling == 1.0
            and _same(norm, llama.RMSNorm, "forward") and norm.weight.dtype == torch.float32
            and type(lm_head) is BlockLinear):
        return None
    return kernels.load().DecodeHead(norm.weight.detach(), norm.eps, _linear(lm_head), isa)


def table_plan(model: nn.Module):
    """A DecodeTable of the model's token table, a float32 BlockEmbedding whose rows are the inputs
    as they are (embedding_multiplier 1), or None."""
    embed = getattr(model, "embed_tokens", None)
    if type(embed) is not BlockEmbedding or embed.dtype != torch.float32 or model.config.embedding_multiplier != 1.0:
        return None
    table = embed.table
    return kernels.load().DecodeTable(table.tiles, table.type_id, table.rows, table.k)


def _windowed(cache, store: KVCache, layer: int) -> bool:
    """The layer keeps keys for a window only, by a KVCache or by the server's slots (slot_cache.py
    keeps those in buffers of their own; no GGUF of a family planned here carries a window, so nothing
    fused reads them): it runs eagerly."""
    return layer in store.windows or (type(cache) is BatchView and layer in cache.owner.windows)


def _store(cache) -> KVCache:
    """The KVCache the keys are stored in (_rows' first, without making its tensors)."""
    return cache if type(cache) is KVCache else cache.owner.store


def _rows(cache) -> tuple[KVCache, torch.Tensor, torch.Tensor]:
    """(the KVCache the keys are stored in, each batch row's row there, the slot its new key goes to)."""
    if type(cache) is KVCache:
        b = cache.batch
        return cache, torch.arange(b), torch.full((b,), cache.offset - 1, dtype=torch.long)
    return cache.owner.store, cache.rows, cache.ends  # the server's slots (cache.BatchView)


def _starts(mask, b: int) -> torch.Tensor | None:
    """Each row's first key under a layer's mask: ALL (every key), Ragged (a span per row), or None
    where the mask is a tensor (padding, a window that cuts): the eager layer reads those."""
    if isinstance(mask, str) and mask == ALL:
        return torch.zeros(b, dtype=torch.long)
    if isinstance(mask, Ragged):
        return torch.tensor([first for first, _ in mask.spans], dtype=torch.long)
    return None


def fuse_decode(model: nn.Module) -> nn.Module:
    """Plan model's decode step (model.fused); nothing where no layer qualifies or the kernels are
    not built. Returns the model."""
    if not kernels.available() or not hasattr(model, "blocks") or next(model.parameters()).device.type != "cpu":
        return model
    isa = kernels.best_isa()
    layers = [layer_plan(block, isa) for block in model.blocks]
    if any(op is not None for op in layers) and len(getattr(model, "rotations", lambda *a: ())(
            torch.zeros(1, 1, dtype=torch.long), torch.float32)) == 2:
        fused = FusedDecode(layers)
        fused.windows = [model.window_of(block) for block in model.blocks]
        fused.lean = (None not in layers and set(fused.windows) == {None} and not model.config.recurrent_layers
                      and _same(model, llama.Llama, "stream", "inputs", "rotations", "rope", "embed", "side_inputs"))
        fused.head = head_plan(model, isa) if fused.lean else None
        fused.table = table_plan(model) if fused.head is not None else None
        model.fused = fused
    return model
