"""AMX (isa 3, csrc/q_amx.cpp): prefill's 16-row steps over two tiles take each group's 16 x 16 dots
from one tile multiply. The dots are the same integers as vpdpbusd's, so every product keeps the
AVX-512 VNNI path's bits; tests/test_kernels.py runs the values, the row counts and the overflow
bounds on isa 3 too, wherever the CPU has it. Where it has not, isa 3 is a one-line error."""

from __future__ import annotations

import pytest
import torch

from nexttok.models import kernels
from test_kernels import random_blocks

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: the kernels are not built")
AMX = kernels.available() and kernels.best_isa() == 3


@pytest.mark.skipif(not AMX, reason="this CPU (or its OS) gives no AMX-INT8 tiles")
@pytest.mark.parametrize("kind", list(kernels.BLOCKS))
@pytest.mark.parametrize(("rows", "k"), [(40, 512), (24, 256), (100, 5376)])  # 5376: long rows, in pieces
def test_amx_products_are_the_vnni_bits(kind, rows, k):
    """16, 32 and 37 rows (two 16-row steps, then 5 rows on vpdpbusd), and 130 (from 128 rows the steps
    share two tiles' chunks, made once for every piece), batches of 8 groups cut by a piece's or the
    row's end: the same bits as AVX-512 VNNI's for every type (Q2_K, Q8_0 and the per-16 types run
    vpdpbusd on both)."""
    raw = random_blocks(kind, rows, k, seed=5)
    weight = kernels.repack(kind, torch.from_numpy(raw), k)
    x = torch.randn(130, k, generator=torch.Generator().manual_seed(k))
    for m in (16, 32, 37, 130):
        vnni, amx = (kernels.mm(kernels.quantize(x[:m], isa), [weight.tiles], [weight.type_id], [rows], isa)
                     for isa in (2, 3))
        assert torch.equal(amx, vnni), m


@pytest.mark.skipif(AMX, reason="this CPU runs AMX")
def test_isa_3_without_amx_is_a_one_line_error():
    raw = random_blocks("Q4_0", 8, 256)
    weight = kernels.repack("Q4_0", torch.from_numpy(raw), 256)
    act = kernels.quantize(torch.randn(16, 256), 1)
    with pytest.raises(RuntimeError, match="isa 3 \\(amx\\): this CPU or its OS gives no AMX-INT8 tiles"):
        kernels.mm(act, [weight.tiles], [weight.type_id], [8], 3)
