"""GGUF's 4-bit block formats, read as groups of 32: w = q·scale + offset, q in 0..15.

    Q4_0  block of 32: d (f16), 16 bytes of nibbles        w = (q - 8)·d
    Q4_1  block of 32: d, m (f16), 16 bytes of nibbles     w = q·d + m
    Q4_K  block of 256: d, dmin (f16), 12 bytes of 6-bit scales and mins (8 of each),
          128 bytes of nibbles                             w = d·sc[j]·q - dmin·mn[j], j = k // 32

In Q4_0 and Q4_1, byte i of a block holds element i (low nibble) and element i + 16 (high nibble);
in Q4_K each 32-byte run holds elements 0..31 of a 64 (low nibbles) and 32..63 (high nibbles).
A block never spans rows, so `raw` is (rows, bytes per row). Q4_K's packed 6-bit scales are
unpacked by the `gguf` package's own reader (Q4_K.get_scale_min).
"""

from __future__ import annotations

import numpy as np
import torch

INT4_KINDS = ("Q4_0", "Q4_1", "Q4_K")  # the formats that are exactly 4-bit groups of 32


def int4_groups(kind: str, raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q (N, K) uint8 in 0..15, scale (N, K/32), offset (N, K/32)) with w = q·scale + offset."""
    rows = raw.shape[0]
    data = torch.from_numpy(np.array(raw, copy=True)).reshape(rows, -1)  # the file is mapped read-only
    if kind == "Q4_0":
        blocks = data.reshape(rows, -1, 18)
        d = _f16(blocks[..., 0:2])
        return _nibbles_split_16(blocks[..., 2:]), d, -8 * d
    if kind == "Q4_1":
        blocks = data.reshape(rows, -1, 20)
        return _nibbles_split_16(blocks[..., 4:]), _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
    if kind == "Q4_K":
        return _q4_k(data.reshape(rows, -1, 144))
    raise ValueError(f"{kind} is not a 4-bit group format ({', '.join(INT4_KINDS)})")


def _f16(pairs: torch.Tensor) -> torch.Tensor:
    """Little-endian float16 from byte pairs (..., 2) uint8 -> (...) float32."""
    return pairs.contiguous().view(torch.float16)[..., 0].float()


def _nibbles_split_16(qs: torch.Tensor) -> torch.Tensor:
    """(N, G, 16) bytes -> (N, G*32): low nibbles are elements 0..15, high ones 16..31."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1).reshape(qs.shape[0], -1)


def _q4_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from gguf.quants import Q4_K

    rows, n = blocks.shape[:2]
    d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])  # (N, B)
    sc, mn = Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12).numpy())  # (N*B, 8) each
    sc = torch.from_numpy(sc.astype(np.float32)).reshape(rows, n, 8)
    mn = torch.from_numpy(mn.astype(np.float32)).reshape(rows, n, 8)
    qs = blocks[..., 16:].reshape(rows, n, 4, 1, 32)  # 4 runs of 32 bytes, each two groups of 32
    q = torch.cat([qs & 0x0F, qs >> 4], dim=3).reshape(rows, -1)  # (N, B*256)
    scale = (d[..., None] * sc).reshape(rows, -1)  # (N, B*8)
    offset = -(dmin[..., None] * mn).reshape(rows, -1)
    return q, scale, offset
