"""Layers over GGUF blocks kept as the file ships them, run by nexttok's own kernels (kernels/).

    BlockLinear     y = x · Wᵀ (+ bias), W the file's block rows (Q4_0 … Q6_K) repacked in tiles
                    of 8 rows; the input is quantized to 8 bits per 32 values for the int8 dot
                    products
    BlockEmbedding  a lookup dequantizes just the rows asked for, exactly the file's values;
                    a tied output layer is a BlockLinear over the very same tiles (no copy)
    BlockExperts    a mixture of experts' stacked expert weights (GGUF's 3-D ffn_*_exps tensors),
                    each token's rows multiplied by its routed experts' tiles only

A fused projection (q/k/v, gate/up) keeps each part in its own type (Qwen2.5's Q4_K_M file
mixes Q5_0 and Q8_0 in one q/k/v), one kernel call for all of them. The bytes held are the
file's (the tiles reorder them, adding nothing but the padding of a last, partial tile): a Q4_K_M
file takes its own size in memory, not 2.4 times it as bfloat16 would.

Every row of the input is quantized and multiplied on its own, in the same order whatever the
row count, so a row's result is the same alone or in a batch (rows_independent in quant.py).
"""

from __future__ import annotations

import torch
from torch import nn

from nexttok.models import kernels


def fits(kind: str, k: int) -> bool:
    """The kernels run rows of this type and length: fits("Q4_K", 896) is False (896 % 256)."""
    return kind in kernels.BLOCKS and k > 0 and k % kernels.BLOCKS[kind][1] == 0


class BlockLinear(nn.Module):
    """y = x · Wᵀ (+ bias), W's rows the parts' rows stacked, each part a kernels.Tiled."""

    def __init__(self, parts: list[kernels.Tiled], isa: int, bias: torch.Tensor | None = None):
        super().__init__()
        if not parts or len({p.k for p in parts}) != 1:
            raise ValueError("a BlockLinear needs one or more parts of one input width")
        self.in_features, self.isa = parts[0].k, isa
        self.kinds = [p.kind for p in parts]
        self.types = [p.type_id for p in parts]
        self.part_rows = [p.rows for p in parts]
        self.matrices = [p.matrices for p in parts]  # a mixture's stacked experts: as many as experts
        for i, p in enumerate(parts):
            self.register_buffer(f"tiles{i}", p.tiles)
        self.out_features = sum(self.part_rows)
        if bias is not None and bias.shape != (self.out_features,):
            raise ValueError(f"a bias of {self.out_features} values needed, got {tuple(bias.shape)}")
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)

    @property
    def parts(self) -> list[kernels.Tiled]:
        return [kernels.Tiled(kind, getattr(self, f"tiles{i}"), rows, self.in_features, matrices)
                for i, (kind, rows, matrices) in enumerate(zip(self.kinds, self.part_rows, self.matrices, strict=True))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tiles = [getattr(self, f"tiles{i}") for i in range(len(self.types))]
        y = kernels.linear(_rows(x, self.in_features), tiles, self.types, self.part_rows, self.bias, self.isa)
        return y.view(*x.shape[:-1], self.out_features)

    def weight_values(self) -> torch.Tensor:
        """W as float32 (N, K): exactly the file's values."""
        return torch.cat([kernels.dequantize(p, torch.arange(p.rows)) for p in self.parts])

    def select(self, rows: torch.Tensor | None = None, columns: slice | None = None) -> BlockLinear:
        """Some output rows (indices) and a run of input columns (whole blocks) of this layer, with
        the very same blocks (tensor parallelism's shards)."""
        columns = columns or slice(0, self.in_features)
        elems = max(kernels.BLOCKS[kind][1] for kind in self.kinds)
        if columns.start % elems or columns.stop % elems or columns.stop <= columns.start:
            raise ValueError(f"a {'/'.join(self.kinds)} layer splits at whole blocks of {elems} inputs, not at "
                             f"{columns.start}:{columns.stop}")
        rows = torch.arange(self.out_features) if rows is None else torch.as_tensor(rows)
        parts, start = [], 0
        for p in self.parts:
            mine = rows[(rows >= start) & (rows < start + p.rows)] - start
            if len(mine):
                _, n, size = kernels.BLOCKS[p.kind]
                raw = kernels.unpack(p, mine)[:, columns.start // n * size:columns.stop // n * size]
                parts.append(kernels.repack(p.kind, raw.contiguous(), columns.stop - columns.start))
            start += p.rows
        bias = None if self.bias is None else self.bias.detach()[rows]
        return BlockLinear(parts, self.isa, bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"blocks={'+'.join(self.kinds)}, isa={kernels.ISAS[self.isa]}")


def _rows(x: torch.Tensor, features: int) -> torch.Tensor:
    """x (..., K) as the kernels take it: (rows, K) contiguous float32 (no copy when it is already)."""
    rows = x.reshape(-1, features)
    if rows.dtype != torch.float32:
        rows = rows.float()
    return rows if rows.is_contiguous() else rows.contiguous()


class BlockEmbedding(nn.Module):
    """A token embedding table kept as GGUF blocks (tiled); a lookup dequantizes only its rows."""

    def __init__(self, table: kernels.Tiled, dtype: torch.dtype):
        super().__init__()
        self.kind, self.embedding_dim, self.num_embeddings = table.kind, table.k, table.rows
        self.dtype = dtype
        self.register_buffer("tiles", table.tiles)

    @property
    def table(self) -> kernels.Tiled:
        return kernels.Tiled(self.kind, self.tiles, self.num_embeddings, self.embedding_dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.rows(ids).to(self.dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of ids as float32 (..., K): exactly the file's values."""
        return kernels.dequantize(self.table, ids.reshape(-1)).view(*ids.shape, self.embedding_dim)

    def weight_values(self) -> torch.Tensor:
        return self.rows(torch.arange(self.num_embeddings))

    def head(self, isa: int) -> BlockLinear:
        """The output layer tied to this table: the same tiles as a BlockLinear."""
        return BlockLinear([self.table], isa)

    def select(self, rows: slice) -> BlockEmbedding:
        """A table of some of these rows, the same blocks (tensor parallelism's shards)."""
        raw = kernels.unpack(self.table, torch.arange(rows.start, rows.stop))
        return BlockEmbedding(kernels.repack(self.kind, raw, self.embedding_dim), self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, blocks={self.kind}"


class BlockExperts(nn.Module):
    """moe.Experts over GGUF blocks: gate_up's parts (the file's gate and up tensors, E × inner rows
    each, an expert's rows after the one before's) and down's (E × hidden rows), in tiles. A call
    reads only the experts its tokens are routed to, each once, the whole MLP in one kernel call
    (kernels.moe_mlp). activation: (name, alpha, limit), "silu" (SwiGLU) or gpt-oss's "swiglu_oai";
    gate_up_bias (E, 2 inner) and down_bias (E, hidden) where the family has them (gpt-oss)."""

    MODES = {"silu": kernels.SILU_MUL, "swiglu_oai": kernels.SWIGLU_OAI}

    def __init__(self, gate_up: list[kernels.Tiled], down: list[kernels.Tiled], num_experts: int, isa: int,
                 activation: tuple[str, float, float], gate_up_bias: torch.Tensor | None = None,
                 down_bias: torch.Tensor | None = None):
        super().__init__()
        self.num_experts, self.isa = num_experts, isa
        self.mode, self.alpha, self.limit = self.MODES[activation[0]], float(activation[1]), float(activation[2])
        self.hidden, self.inner = gate_up[0].k, down[0].k
        self.gate_up = BlockLinear(gate_up, isa)  # the tiles and their types (run only through moe_mlp)
        self.down = BlockLinear(down, isa)
        self.gate_up_proj_bias = None if gate_up_bias is None else nn.Parameter(gate_up_bias.float(),
                                                                                 requires_grad=False)
        self.down_proj_bias = None if down_bias is None else nn.Parameter(down_bias.float(), requires_grad=False)

    def forward(self, x: torch.Tensor, routing) -> torch.Tensor:
        """x (N, hidden) -> (N, hidden): Σ_j weights_j · expert_{ids_j}(x) (routing: moe.Routing)."""
        bias = (None if self.gate_up_proj_bias is None else self.gate_up_proj_bias.detach(),
                None if self.down_proj_bias is None else self.down_proj_bias.detach())
        y = kernels.moe_mlp(_rows(x, self.hidden), routing.ids, routing.weights, self.gate_up.parts, self.down.parts,
                            self.num_experts, self.isa, self.mode, self.alpha, self.limit, *bias)
        return y.to(x.dtype)

    def expert_values(self, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert e's gate_up (2 inner, hidden) and down (hidden, inner) as float32: the file's values."""
        def rows_of(layer: BlockLinear) -> torch.Tensor:
            return torch.cat([kernels.dequantize(p, torch.arange(e * p.rows // self.num_experts,
                                                                 (e + 1) * p.rows // self.num_experts))
                              for p in layer.parts])
        return rows_of(self.gate_up), rows_of(self.down)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden}, inner={self.inner}, "
                f"blocks={'+'.join(self.gate_up.kinds)}/{'+'.join(self.down.kinds)}, isa={kernels.ISAS[self.isa]}")
