"""Megatron-style tensor parallelism: one model's weights split over the ranks of a process group.

    attention   q/k/v rows by heads (column-parallel: each rank computes whole heads of its own);
                o_proj by those heads' input columns (row-parallel: partial sums, all-reduced)
    MLP         gate/up rows by a share of the inner width (column); down by those columns (row)
    vocabulary  embedding rows (each rank looks up the ids it holds, zeros for the rest, all-reduced)
                and lm_head rows (each rank a share of the logits, all-gathered into whole rows)
    KV cache    follows from the heads: a rank computes, stores and attends over its own KV heads

Per layer two all-reduces of (B, T, hidden); per call one more (the embedding) and one all-gather
(the logits). The rest (norms, RoPE, residual adds, position embeddings) is computed whole, and
identically, on every rank: it is cheap, and a split would only add collectives.

Grouped-query attention: KV heads are split as evenly as possible, each with the query heads that
read it (SmolLM2's 3 KV heads over 2 ranks: 1 + 2, with 3 + 6 query heads); when ranks outnumber
KV heads, each KV head is repeated on world / n_kv ranks and its query heads are split among them.
Quantized layers are sliced as they are (quant.py, block_quant.py `select`): the same 4-bit groups,
8-bit rows, GGUF blocks and scales, never dequantized; a split falls on whole groups (32 inputs) or
blocks (32, or 256 for the K types).

An architecture says which layers these are (PARALLEL_HEADS, PARALLEL_INNER on its attention and
MLP modules, PARALLEL_VOCAB on the model); the model's own forward code runs unchanged, over the
smaller layers and head counts.

Plain collectives (all_reduce, all_gather), not DTensor's parallelize_module: the 4-bit and 8-bit
kernels have no DTensor sharding rules, the layers already compute on plain local tensors, and
DTensor's per-op dispatch would be paid ~1,500 times a decode step for the same four collectives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from nexttok.models import kernels
from nexttok.models.block_quant import BlockEmbedding, BlockLinear
from nexttok.models.quant import GROUP, Int4Linear, Int8Linear, Q8Embedding, nibble_order

QUANTIZED = (Int4Linear, Int8Linear, BlockLinear)


@dataclass(frozen=True)
class Heads:
    q: range  # this rank's query heads
    kv: range  # this rank's KV heads


def head_split(n_head: int, n_kv: int, rank: int, world: int) -> Heads:
    """The heads of one rank, KV heads with the query heads that read them:
    head_split(9, 3, 1, 2) == Heads(q=range(3, 9), kv=range(1, 3))."""
    group = n_head // n_kv  # query heads per KV head
    if n_kv >= world:
        first, last = rank * n_kv // world, (rank + 1) * n_kv // world
        return Heads(range(first * group, last * group), range(first, last))
    share = world // n_kv  # ranks per repeated KV head
    if world % n_kv or group % share:
        raise ValueError(f"{world} ranks cannot share {n_kv} KV heads of {group} query heads each (use a number "
                         f"of ranks that divides the KV heads, or a multiple of them that divides the query heads)")
    kv, per = rank // share, group // share
    start = kv * group + (rank % share) * per
    return Heads(range(start, start + per), range(kv, kv + 1))


UNSPLIT = ("gemma4_text", "gemma4")  # architectures tensor parallelism does not split yet


def check_world(config, world: int) -> None:
    """Raise (one line naming --tensor-parallel) unless a model of this config splits over `world`
    ranks: its heads (head_split), its MLP's inner width and its vocabulary (split). Checked before
    any rank starts. SmolLM2-135M (9 heads, 3 KV heads) splits over 1, 2, 3 or 9 ranks."""
    if world > 1 and config.is_moe:
        raise ValueError(f"--tensor-parallel {world}: mixture-of-experts layers ({config.model_type}) are not split "
                         "over ranks yet; run it on one (--tensor-parallel 1)")
    if world > 1 and config.recurrent_layers:
        raise ValueError(f"--tensor-parallel {world}: recurrent layers ({config.model_type}) are not split over ranks "
                         "yet; run it on one (--tensor-parallel 1)")
    if world > 1 and config.model_type in UNSPLIT:
        raise ValueError(f"--tensor-parallel {world}: {config.model_type}'s attention (layers of several head sizes, "
                         "KV-shared layers, per-layer inputs) is not split over ranks yet; run it on one "
                         "(--tensor-parallel 1)")
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads
    if not _heads_split(n_head, n_kv, world):
        fits = [n for n in range(1, n_head + 1) if _heads_split(n_head, n_kv, n)]
        listed = ", ".join(map(str, fits[:-1])) + f" or {fits[-1]}" if len(fits) > 1 else str(fits[0])
        raise ValueError(f"--tensor-parallel {world}: the model has {n_kv} KV heads ({n_head} attention heads); "
                         f"use {listed} ranks (at most the KV heads, or a multiple of them that divides the "
                         "attention heads)")
    for what, n, unit in (("MLP inner width", config.intermediate_size, 1), ("vocabulary", config.vocab_size, 32)):
        try:
            for rank in range(world):
                split(n, rank, world, unit)
        except ValueError:
            units = n // unit if n % unit == 0 else n
            raise ValueError(f"--tensor-parallel {world}: the model's {what} ({n}) splits over at most {units} "
                             "ranks") from None


def _heads_split(n_head: int, n_kv: int, world: int) -> bool:
    try:
        head_split(n_head, n_kv, 0, world)  # its rule is the same for every rank
    except ValueError:
        return False
    return True


def split(n: int, rank: int, world: int, unit: int = 1) -> range:
    """Rank's share of n in whole units (as even as those allow): split(96, 1, 2, 32) == range(32, 96)."""
    unit = unit if n % unit == 0 else 1
    units = n // unit
    share = range(rank * units // world * unit, (rank + 1) * units // world * unit)
    if not share:
        raise ValueError(f"{n} rows are too few to split over {world} ranks")
    return share


def all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    """The sum over the ranks. A CPU tensor in bfloat16/float16 is summed in float32 and rounded once,
    as one process's matmul would round its whole sum."""
    if x.device.type == "cpu" and x.dtype != torch.float32:
        total = x.float()
        dist.all_reduce(total, group=group)
        return total.to(x.dtype)
    dist.all_reduce(x, group=group)
    return x


class RowParallel(nn.Module):
    """A linear layer over this rank's share of the input features: partial sums, all-reduced,
    then the bias (once)."""

    def __init__(self, inner: nn.Module, bias: torch.Tensor | None, group):
        super().__init__()
        self.inner, self.group = inner, group
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(self.inner(x), self.group)
        return y if self.bias is None else y + self.bias


class VocabEmbedding(nn.Module):
    """An embedding over vocabulary rows [start, start + rows): ids elsewhere look up zeros, and the
    all-reduce fills them in from the rank that holds them (exactly: every other term is 0)."""

    def __init__(self, inner: nn.Module, start: int, group):
        super().__init__()
        self.inner, self.start, self.group = inner, start, group
        self.rows = inner.num_embeddings

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows)
        x = self.inner(local.clamp(0, self.rows - 1)).masked_fill(outside[..., None], 0)  # (..., hidden)
        return all_reduce(x, self.group)


class VocabHead(nn.Module):
    """lm_head over this rank's vocabulary rows; the logits of every rank all-gathered into whole
    rows (..., vocab). sizes: each rank's number of rows, in rank order."""

    def __init__(self, inner: nn.Module, sizes: list[int], group):
        super().__init__()
        self.inner, self.sizes, self.group = inner, sizes, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = self.inner(x)  # (..., rows of this rank)
        width = max(self.sizes)
        if local.shape[-1] < width:  # all_gather takes equal shapes: pad, then cut
            local = torch.nn.functional.pad(local, (0, width - local.shape[-1]))
        parts = [torch.empty_like(local) for _ in self.sizes]
        dist.all_gather(parts, local.contiguous(), group=self.group)
        return torch.cat([part[..., :size] for part, size in zip(parts, self.sizes, strict=True)], dim=-1)


def shard_model(model: nn.Module, rank: int, world: int, group) -> nn.Module:
    """Keep this rank's share of every attention, MLP and vocabulary layer (in place)."""
    vocab = model.PARALLEL_VOCAB
    if model.compiled is not None:
        raise ValueError("--compile and --tensor-parallel do not combine (the compiled step has no collectives)")
    unit = max([GROUP if isinstance(m, Int4Linear) else 1 for m in model.modules()] +
               [kernels.BLOCKS[kind][1] for m in model.modules() if isinstance(m, BlockLinear) for kind in m.kinds])
    model.fused = None  # the fused decode layers have no collectives: the sharded step runs eagerly
    for name, module in list(model.named_modules()):
        try:
            if hasattr(module, "PARALLEL_HEADS"):
                _shard_attention(module, rank, world, group)
            elif hasattr(module, "PARALLEL_INNER"):
                _shard_mlp(module, rank, world, group, unit)
        except ValueError as e:
            raise ValueError(f"tensor parallelism cannot split {name}: {e}") from None
    _shard_vocab(model, *vocab, rank, world, group)
    nibble_order.cache_clear()  # the 4-bit unpacking tables are needed once, at the split
    return model


def _shard_attention(module: nn.Module, rank: int, world: int, group) -> None:
    column, row = module.PARALLEL_HEADS
    n_head, n_kv, hd = module.n_head, module.n_kv_head, module.head_dim
    heads = head_split(n_head, n_kv, rank, world)
    q = torch.arange(heads.q.start * hd, heads.q.stop * hd)  # rows: q heads, then k heads, then v heads
    kv = torch.arange(heads.kv.start * hd, heads.kv.stop * hd)
    rows = torch.cat([q, n_head * hd + kv, (n_head + n_kv) * hd + kv])
    setattr(module, column, take_rows(getattr(module, column), rows))
    setattr(module, row, row_parallel(getattr(module, row), slice(heads.q.start * hd, heads.q.stop * hd), group))
    module.n_head, module.n_kv_head = len(heads.q), len(heads.kv)


def _shard_mlp(module: nn.Module, rank: int, world: int, group, unit: int) -> None:
    column, row = module.PARALLEL_INNER
    up, down = getattr(module, column), getattr(module, row)
    inner = down.in_features
    share = split(inner, rank, world, unit)
    parts = up.out_features // inner  # gate and up stacked (2), or one projection
    rows = torch.cat([torch.arange(share.start, share.stop) + p * inner for p in range(parts)])
    setattr(module, column, take_rows(up, rows))
    setattr(module, row, row_parallel(down, slice(share.start, share.stop), group))


def _shard_vocab(model: nn.Module, embed_name: str, head_name: str, rank: int, world: int, group) -> None:
    embedding, head = getattr(model, embed_name), getattr(model, head_name)
    vocab = embedding.num_embeddings
    shares = [split(vocab, r, world, 32) for r in range(world)]
    mine = slice(shares[rank].start, shares[rank].stop)
    tied = isinstance(embedding, nn.Embedding) and getattr(head, "weight", None) is embedding.weight
    if isinstance(embedding, (Q8Embedding, BlockEmbedding)):
        local = embedding.select(mine)
    else:
        local = nn.Embedding.from_pretrained(embedding.weight.detach()[mine].clone(), freeze=True)
    rows = torch.arange(mine.start, mine.stop)
    local_head = _linear(local.weight, None) if tied else take_rows(head, rows)
    setattr(model, embed_name, VocabEmbedding(local, mine.start, group))
    setattr(model, head_name, VocabHead(local_head, [len(s) for s in shares], group))


def take_rows(layer: nn.Module, rows: torch.Tensor) -> nn.Module:
    """The layer's output rows `rows` (column-parallel)."""
    if isinstance(layer, QUANTIZED):
        return layer.select(rows=rows)
    if isinstance(layer, nn.Linear):
        bias = None if layer.bias is None else layer.bias.detach()[rows].clone()
        return _linear(layer.weight.detach()[rows].clone(), bias)
    raise ValueError(f"no rule to split a {type(layer).__name__}")


def row_parallel(layer: nn.Module, columns: slice, group) -> RowParallel:
    """The layer over input features `columns`, its partial sums all-reduced (row-parallel)."""
    bias = None if layer.bias is None else layer.bias.detach().clone()
    if isinstance(layer, QUANTIZED):
        inner = layer.select(columns=columns)
        inner.bias = None
    elif isinstance(layer, nn.Linear):
        inner = _linear(layer.weight.detach()[:, columns].clone(), None)
    else:
        raise ValueError(f"no rule to split a {type(layer).__name__}")
    return RowParallel(inner, bias, group)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=False)
    return layer
