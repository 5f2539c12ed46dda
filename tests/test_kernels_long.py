"""Long rows (csrc/qtypes.h): a weight whose rows are longer than 5120 values keeps its tiles in
groups of 12, each group piece by piece, so that a one-row product reads a piece of the activation
row over a group's tiles while it stays in L1. tests/test_kernels.py checks the values and the
products over such weights (its 5376-value shapes); here, the layout itself and a mixture's experts."""

from __future__ import annotations

import math

import pytest
import torch

from nexttok.models import kernels
from nexttok.models.block_quant import BlockExperts
from nexttok.models.moe import Routing
from test_kernels import ISAS, quantized, random_blocks, reference

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: the kernels are not built")


def pieces(units: int, k: int) -> list[tuple[int, int]]:
    """Each piece's units (first, stop) of a row of k values in `units` blocks: about 2048 values a piece."""
    n = math.ceil(k / 2048) if k > 5120 else 1
    return [(units * p // n, units * (p + 1) // n) for p in range(n)]


@pytest.mark.parametrize(("kind", "rows", "k"), [("Q8_0", 104, 5376), ("Q4_K", 200, 8960), ("IQ4_XS", 8, 5632)])
def test_a_group_holds_each_piece_of_its_tiles_in_turn(kind, rows, k):
    """Piece p of a group's tiles is those tiles as a short row of piece p's blocks would have them:
    the tiles of 8 rows one after another, each group (the last of fewer tiles) a piece at a time."""
    _, elems, size = kernels.BLOCKS[kind]
    raw = torch.from_numpy(random_blocks(kind, rows, k, seed=1))
    flat = kernels.repack(kind, raw, k).tiles.view(-1)
    tiles, units = math.ceil(rows / kernels.TILE), k // elems
    unit_bytes = kernels.load().tile_bytes(kernels.BLOCKS[kind][0], elems)
    assert len(pieces(units, k)) == math.ceil(k / 2048) > 1
    at = 0
    for g0 in range(0, tiles, 12):
        group = range(g0 * kernels.TILE, min(rows, (g0 + 12) * kernels.TILE))
        for first, stop in pieces(units, k):
            short = kernels.repack(kind, raw[group.start:group.stop, first * size:stop * size].contiguous(),
                                   (stop - first) * elems).tiles.view(-1)
            assert short.numel() == (stop - first) * unit_bytes * math.ceil(len(group) / kernels.TILE)
            assert torch.equal(flat[at:at + short.numel()], short), (g0, first)
            at += short.numel()
    assert at == flat.numel()


def test_short_rows_keep_whole_tiles_one_after_another():
    raw = torch.from_numpy(random_blocks("Q4_K", 16, 5120, seed=2))
    tiles = kernels.repack("Q4_K", raw, 5120).tiles
    for t in range(2):
        alone = kernels.repack("Q4_K", raw[8 * t:8 * t + 8].contiguous(), 5120).tiles
        assert torch.equal(tiles[t], alone[0])


@pytest.mark.parametrize("isa", ISAS)
def test_experts_of_long_rows_are_laid_out_each_alone(isa):
    """down's rows of 5376 values (long): each expert's 224 rows (28 tiles: groups of 12, 12 and 4)
    laid out as a matrix of its own and read by the kernel one expert at a time; expert_values gives
    its values back, and each token's output is its routed experts' sum."""
    e, hidden, inner, n = 3, 224, 5376, 4
    shapes = {"gate": ("Q8_0", inner, hidden), "up": ("Q4_0", inner, hidden), "down": ("Q4_K", hidden, inner)}
    raws = {name: random_blocks(kind, e * rows, k, seed=i) for i, (name, (kind, rows, k)) in enumerate(shapes.items())}
    tiled = {name: kernels.repack(kind, torch.from_numpy(raws[name]), k, matrices=e)
             for name, (kind, _, k) in shapes.items()}
    values = {name: reference(kind, raws[name]).view(e, rows, k) for name, (kind, rows, k) in shapes.items()}
    block = BlockExperts([tiled["gate"], tiled["up"]], [tiled["down"]], e, isa, ("silu", 1.0, 0.0))
    wrong = kernels.Tiled("Q4_K", tiled["down"].tiles, e * hidden, inner, matrices=5)  # 672 rows: not 5 matrices
    with pytest.raises(RuntimeError, match="672 rows are not 5 matrices of whole tiles of 8"):
        kernels.dequantize(wrong, torch.arange(2))
    for g in range(e):
        gate_up, down = block.expert_values(g)
        assert torch.equal(gate_up, torch.cat((values["gate"][g], values["up"][g])))
        assert torch.equal(down, values["down"][g])
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(5))
    ids, weights = torch.tensor([[2, 0], [1, 1], [0, 2], [2, 1]]), torch.rand(n, 2)
    got = block(x, Routing(ids, weights, torch.rand(n, e)))
    for t in range(n):
        expected = torch.zeros(hidden, dtype=torch.float64)
        for j, g in enumerate(ids[t].tolist()):
            h = quantized(x[t:t + 1]) @ torch.cat((values["gate"][g], values["up"][g])).double().T
            act = (torch.nn.functional.silu(h[:, :inner]) * h[:, inner:]).float()
            expected += weights[t, j].double() * (quantized(act) @ values["down"][g].double().T)[0]
        assert (got[t].double() - expected).abs().max() <= 1e-4 * expected.abs().max(), t
