"""Quantized linear layers: weights kept as 4-bit integers with a scale and a zero per group of 32.

    w[n, k] = (q[n, k] - 8) · scale[n, g] + zero[n, g]      g = k // 32,  q in 0..15

That is the layout of torch's int4pack kernel (`_weight_int4pack_mm_for_cpu`), which multiplies by
such a weight without ever writing it out as floats: half a byte a weight instead of four. GGUF's
4-bit blocks map onto it exactly (see gguf_blocks.py):

    Q4_0   w = (q - 8)·d              scale = d,       zero = 0
    Q4_1   w = q·d + m                scale = d,       zero = m + 8d
    Q4_K   w = d·sc·q - dmin·mn       scale = d·sc,    zero = 8·d·sc - dmin·mn   (per 32 of 256)

An HF checkpoint is quantized the same way at load (`--dtype int4`: the min and max of each group
of 32 become q = 0 and q = 15). `--dtype int8` keeps one int8 per weight with one scale per output
row (`_weight_int8pack_mm`; torch has no group-wise int8 kernel, and at 8 bits a row scale loses
little).

Both kernels are fast with bfloat16 activations and several times slower with float32 ones on
x86 (measured: 0.05 vs 1.5 ms for a 1536×576 layer), so they take bfloat16 in and give the
caller's dtype back. The packed layout depends on the CPU's vector width: it is made at load,
never stored.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

GROUP = 32
ACTIVATION = torch.bfloat16  # the dtype both kernels are fast in
BITS = {"int8": 8, "int4": 4}  # --dtype values that quantize the linear layers at load


def _rows(x: torch.Tensor, features: int) -> torch.Tensor:
    """x (..., K) as the kernels take it: (rows, K), contiguous bfloat16 (no copy when it is already)."""
    rows = x.reshape(-1, features)
    if rows.dtype != ACTIVATION:
        rows = rows.to(ACTIVATION)
    return rows if rows.is_contiguous() else rows.contiguous()


def _output(y: torch.Tensor, x: torch.Tensor, features: int, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's (rows, N) back in x's shape and dtype, plus the bias."""
    y = y.view(*x.shape[:-1], features)
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    return y if bias is None else y + bias


class Int4Linear(nn.Module):
    """y = x · Wᵀ (+ bias) with W in 4-bit groups; x (..., in_features) -> (..., out_features)."""

    def __init__(self, packed: torch.Tensor, scale_zero: torch.Tensor, in_features: int, out_features: int,
                 bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("packed", packed)  # (N, K/2) uint8, the kernel's own layout
        self.register_buffer("scale_zero", scale_zero)  # (K/32, N, 2) bfloat16
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @staticmethod
    def fits(out_features: int, in_features: int) -> bool:
        """The kernel's shape rule: whole groups of 32 along the input, rows in tiles of 16."""
        return in_features % GROUP == 0 and out_features % 16 == 0

    @classmethod
    def from_groups(cls, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                    bias: torch.Tensor | None = None) -> Int4Linear:
        """From w = q·scale + offset: q (N, K) integers 0..15, scale and offset (N, K/32)."""
        n, k = q.shape
        if not cls.fits(n, k):
            raise ValueError(f"a 4-bit layer needs in_features % {GROUP} == 0 and out_features % 16 == 0, "
                             f"got {k} and {n}")
        if q.device.type != "cpu":
            raise ValueError("4-bit layers run on the CPU kernel; load on the CPU or use --dtype bfloat16")
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
        zero = offset.float() + 8 * scale.float()
        scale_zero = torch.stack([scale.float().T, zero.T], dim=-1).to(ACTIVATION).contiguous()  # (G, N, 2)
        return cls(packed, scale_zero, k, n, bias)

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int4Linear:
        """Round a float weight (N, K) to 4 bits per group of 32: each group's min is q = 0, its max q = 15."""
        n, k = weight.shape
        groups = weight.float().reshape(n, k // GROUP, GROUP)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp(min=1e-10)
        q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).reshape(n, k)
        return cls.from_groups(q, scale, low, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(_rows(x, self.in_features), self.packed, GROUP,
                                                        self.scale_zero)
        return _output(y, x, self.out_features, self.bias)

    def weight_values(self) -> torch.Tensor:
        """The weight as float32 (N, K), by the kernel itself: for checks and for viewers."""
        eye = torch.eye(self.in_features, dtype=ACTIVATION)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP, self.scale_zero).float().T

    def select(self, rows: torch.Tensor | None = None, columns: slice | None = None) -> Int4Linear:
        """A layer of some output rows (indices) and a run of input columns (whole groups) of this
        one, with the very same 4-bit values, scales and zeros (tensor parallelism's shards)."""
        rows = torch.arange(self.out_features) if rows is None else rows
        columns = columns or slice(0, self.in_features)
        if columns.start % GROUP or columns.stop % GROUP:
            raise ValueError(f"a 4-bit layer splits at whole groups of {GROUP} inputs, not at {columns.start}:"
                             f"{columns.stop}")
        if not self.fits(len(rows), columns.stop - columns.start):
            raise ValueError(f"a 4-bit shard needs rows in tiles of 16, got {len(rows)}")
        q = unpack_int4(self.packed, self.out_features, self.in_features)[rows, columns]  # (n, k) 0..15
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
        groups = slice(columns.start // GROUP, columns.stop // GROUP)
        scale_zero = self.scale_zero[groups][:, rows].contiguous()  # (k/32, n, 2)
        bias = None if self.bias is None else self.bias.detach()[rows]
        return Int4Linear(packed, scale_zero, q.shape[1], q.shape[0], bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bits=4, group={GROUP}"


def unpack_int4(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The 4-bit values (N, K) uint8 of a weight in the kernel's packed layout (which depends on the
    CPU's vector width): each byte holds two of them, in the order nibble_order finds."""
    nibbles = torch.stack([packed & 15, packed >> 4], dim=-1).flatten()  # byte by byte, low half first
    values = torch.empty(n * k, dtype=torch.uint8)
    values[nibble_order(n, k)] = nibbles
    return values.view(n, k)


@functools.lru_cache(maxsize=8)
def nibble_order(n: int, k: int) -> torch.Tensor:
    """Where each packed nibble of an (N, K) weight comes from (flat index n·K + k), found by packing
    probes whose values are the base-16 digits of their own index: the packing is a permutation,
    so this reads it back whatever layout the kernel picked. nibble_order(16, 32)[0] == 0."""
    index = torch.arange(n * k, dtype=torch.int64)
    order = torch.zeros(n * k, dtype=torch.int64)
    for digit in range(max(1, ((n * k - 1).bit_length() + 3) // 4)):
        probe = ((index >> (4 * digit)) & 15).view(n, k).to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
        order |= torch.stack([packed & 15, packed >> 4], dim=-1).flatten().long() << (4 * digit)
    return order


class Int8Linear(nn.Module):
    """y = x · Wᵀ (+ bias) with W as int8 and one scale per output row."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("q", q.to(torch.int8).contiguous())  # (N, K)
        self.register_buffer("scales", scales.to(ACTIVATION))  # (N,)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        """Symmetric per row: the row's largest |w| becomes ±127."""
        scales = (weight.float().abs().amax(-1) / 127).clamp(min=1e-10)
        q = torch.round(weight.float() / scales[:, None]).clamp(-127, 127)
        return cls(q, scales, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(_rows(x, self.in_features), self.q, self.scales)
        return _output(y, x, self.out_features, self.bias)

    def weight_values(self) -> torch.Tensor:
        return self.q.float() * self.scales.float()[:, None]

    def select(self, rows: torch.Tensor | None = None, columns: slice | None = None) -> Int8Linear:
        """A layer of some output rows (indices) and a run of input columns of this one, the same
        int8 values and row scales (tensor parallelism's shards)."""
        rows = torch.arange(self.out_features) if rows is None else rows
        columns = columns or slice(0, self.in_features)
        bias = None if self.bias is None else self.bias.detach()[rows]
        return Int8Linear(self.q[rows, columns], self.scales[rows], bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bits=8, per row"


class Q8Embedding(nn.Module):
    """An embedding table kept as GGUF's Q8_0 ships it: int8 values with one float16 scale per 32.
    A lookup dequantizes just the rows asked for, exactly; 34 bytes per 32 values instead of 64."""

    def __init__(self, q: torch.Tensor, d: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.num_embeddings, self.embedding_dim = q.shape
        self.register_buffer("q", q.to(torch.int8).contiguous())  # (V, K)
        # float16 scales kept as their bits: a model.to(dtype) must not round them
        self.register_buffer("d_bits", d.to(torch.float16).contiguous().view(torch.int16))  # (V, K/32)
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.rows(ids).to(self.dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of ids as float32 (..., K): exactly the file's q·d."""
        values = self.q[ids].float().view(*ids.shape, -1, GROUP)  # (..., K/32, 32)
        scales = self.d_bits[ids].view(torch.float16).float()[..., None]  # (..., K/32, 1)
        return (values * scales).view(*ids.shape, self.embedding_dim)

    def weight_values(self) -> torch.Tensor:
        """The whole table as float32 (V, K)."""
        return self.rows(torch.arange(self.num_embeddings))

    def select(self, rows: slice) -> Q8Embedding:
        """A table of some of these rows, the same int8 values and scales (tensor parallelism's shards)."""
        return Q8Embedding(self.q[rows], self.d_bits[rows].view(torch.float16), self.dtype)


def int8_rows(chunks) -> Int8Linear:
    """An Int8Linear from a weight given as row chunks (float tensors), so that a 49152-row table
    never exists whole in float32."""
    qs, scales = [], []
    for chunk in chunks:
        layer = Int8Linear.quantize(chunk)
        qs.append(layer.q)
        scales.append(layer.scales)
    return Int8Linear(torch.cat(qs), torch.cat(scales))


def quantized_linear(weight: torch.Tensor, bias: torch.Tensor | None, bits: int) -> nn.Module:
    """A float weight (N, K) as a 4- or 8-bit layer; a shape the 4-bit kernel does not take (a
    50257-row vocabulary) gets 8 bits instead."""
    if bits == 4 and Int4Linear.fits(*weight.shape):
        return Int4Linear.quantize(weight, bias)
    return Int8Linear.quantize(weight, bias)


def quantize_linears(model: nn.Module, bits: int) -> nn.Module:
    """Replace every nn.Linear of a loaded model by a quantized one (a tied lm_head stays the
    embedding's float tensor: the lookup needs it anyway), the rest in bfloat16. In place."""
    tied = model.config.tie_word_embeddings
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or (tied and name == "lm_head"):
            continue
        bias = None if module.bias is None else module.bias.detach().to(ACTIVATION)
        model.set_submodule(name, quantized_linear(module.weight.detach(), bias, bits))
    return model.to(ACTIVATION)


def rows_independent(model: nn.Module) -> bool:
    """True when no layer's result for one row depends on how many rows the call has: every
    matmul is a 4- or 8-bit kernel here (checked for 1..40 rows in tests/test_quant.py), none a
    float nn.Linear (whose BLAS picks its kernel by row count). Then a batch needs no padding to
    give each request exactly what it gets alone."""
    return not any(isinstance(m, nn.Linear) for m in model.modules())
