"""nexttok's block kernels (kernels/) against the gguf package's own dequantization.

Weights are random file blocks of every type (random bytes, with sane float16 scales); the
reference product is the gguf package's dequantized weight times the activation quantized to 8 bits
per 32 as the kernels do it (then the kernels' only difference is float summation order), and
times the float activation (the error 8-bit activations add). Every instruction set this CPU runs
is tested, the portable one included.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

from nexttok.models import kernels
from nexttok.models.block_quant import BlockEmbedding, BlockLinear, fits

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: the kernels are not built")

# where each type keeps its float16 scales (byte offsets in a block); the rest is random (every
# bit pattern of the quants and of the 4- and 6-bit scales is valid) but MXFP4's exponent byte
F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
              "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,),
              "MXFP4": ()}
MXFP4_EXPONENTS = (118, 131)  # E8M0 bytes drawn: scales 2^-10 .. 2^2, values within ±48
ISAS = list(range(kernels.best_isa() + 1)) if kernels.available() else []


@pytest.fixture(autouse=True)
def _seeded():
    """Every test draws the same activations on every run (the bounds hold for any draw)."""
    torch.manual_seed(0)


def random_blocks(kind: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """(rows, bytes per row) uint8 of valid blocks: random quants, scales ~N(0, 0.01)."""
    _, elems, size = kernels.BLOCKS[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, k // elems, size), dtype=np.uint8)
    for at in F16_FIELDS[kind]:
        scales = (rng.standard_normal((rows, k // elems)) * 0.01).astype(np.float16)
        raw[:, :, at:at + 2] = scales.view(np.uint8).reshape(rows, k // elems, 2)
    if kind == "MXFP4":
        raw[:, :, 0] = rng.integers(*MXFP4_EXPONENTS, size=(rows, k // elems), dtype=np.uint8)
    return raw.reshape(rows, -1)


def reference(kind: str, raw: np.ndarray) -> torch.Tensor:
    """The gguf package's float32 values of the blocks (rows, k)."""
    return torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType[kind]).astype(np.float32))


def quantized(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels see it: int8 per 32 values, q = round(x · (127 / max|x|)) in float32 (half to
    even), scale max|x| / 127 — the same float32 steps, so the integers match the kernels' own."""
    groups = x.float().view(x.shape[0], -1, 32)
    amax = groups.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127, dtype=torch.float32) / amax, 0)
    q = torch.round(groups * inv)
    return (q.double() * (amax / 127).double()).view(x.shape).double()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("m", "k", "mode"), [(1, 8960, kernels.SILU_MUL), (3, 576, kernels.PLAIN),
                                              (17, 1536, kernels.GELU_TANH_MUL), (1, 32, kernels.PLAIN)])
def test_every_isa_quantizes_to_the_reference_bits(isa, m, k, mode):
    """AVX2's vector quantize (and a long row shared out among threads in pieces) gives the integers,
    scales and sums of the reference steps bit for bit, ties to even and an all-zero group included."""
    x = torch.randn(m, k * (1 if mode == kernels.PLAIN else 2), generator=torch.Generator().manual_seed(k)) * 3
    x[0, :32] = 0
    if mode == kernels.PLAIN and k >= 64:
        x[0, 32:64] = torch.tensor([127.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.5, 0.0] * 4)  # q = x: halves round to even
    act = kernels.quantize(x, isa, mode)
    gated = x if mode == kernels.PLAIN else (F.silu(x[:, :k]) if mode == kernels.SILU_MUL
                                             else F.gelu(x[:, :k], approximate="tanh")) * x[:, k:]
    groups = gated.view(m, -1, 32)
    amax = groups.abs().amax(-1)
    q = torch.round(groups * torch.where(amax > 0, 127 / amax, 0).unsqueeze(-1))
    exact = mode == kernels.PLAIN  # the gated values are act(gate)·up in C++'s own exp/tanh: within a step of 8 bits
    assert (act.q.view(m, -1, 32).float() - q).abs().max() <= (0 if exact else 1)
    assert torch.equal(act.s.view(m, -1, 2), act.q.view(m, -1, 2, 16).sum(-1, dtype=torch.int16))
    if exact:
        assert torch.equal(act.d, amax / 127)
    if isa > 0:  # the portable path's own bits
        portable = kernels.quantize(x, 0, mode)
        assert all(torch.equal(a, b) for a, b in zip((act.q, act.d, act.s, act.ds),
                                                     (portable.q, portable.d, portable.s, portable.ds), strict=True))


# rows (some not a multiple of the 8-row tile), k; 100 x 5376: long rows (csrc/qtypes.h), 13 tiles in
# a whole group and a group of one, each row in 3 pieces
SHAPES = [(8, 256), (13, 512), (1, 256), (21, 768), (100, 5376)]


@pytest.mark.parametrize("kind", list(kernels.BLOCKS))
@pytest.mark.parametrize(("rows", "k"), SHAPES)
def test_tiles_hold_exactly_the_file_values(kind, rows, k):
    raw = random_blocks(kind, rows, k)
    weight = kernels.repack(kind, torch.from_numpy(raw), k, chunk_bytes=raw.shape[1] * 8)  # several chunks
    every = torch.arange(rows)
    assert torch.equal(kernels.dequantize(weight, every), reference(kind, raw))
    assert torch.equal(kernels.unpack(weight, every), torch.from_numpy(raw))
    picked = torch.tensor([rows - 1, 0])
    assert torch.equal(kernels.dequantize(weight, picked), reference(kind, raw)[picked])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", list(kernels.BLOCKS))
@pytest.mark.parametrize(("rows", "k"), SHAPES)
@pytest.mark.parametrize("m", [1, 3, 5, 6, 9, 15, 17, 31])  # every remainder of the 8- and 4-row steps, and VNNI's 16
def test_product_equals_dequantized_weight_times_8_bit_activation(isa, kind, rows, k, m):
    raw = random_blocks(kind, rows, k, seed=rows + k)
    weight = kernels.repack(kind, torch.from_numpy(raw), k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    y = kernels.mm(kernels.quantize(x, isa), [weight.tiles], [weight.type_id], [rows], isa)
    w = reference(kind, raw).double()
    exact = quantized(x) @ w.T  # what the int8 sums compute, in float64
    scale = (x.abs().double() @ w.abs().T).max()
    assert (y.double() - exact).abs().max() <= 1e-5 * scale
    assert (y.double() - x.double() @ w.T).abs().max() <= 2e-2 * scale  # 8-bit activations' error


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", list(kernels.BLOCKS))
@pytest.mark.parametrize(("rows", "k"), [(24, 512), (200, 5376)])  # 5376: long rows, one row a piece at a time
def test_a_row_gets_the_same_bits_whatever_the_row_count(isa, kind, rows, k):
    """What keeps a GGUF model batch invariant in the server (quant.rows_independent): the 8-, 4- and
    fewer-row steps sum each row's products in one order, bit for bit."""
    raw = random_blocks(kind, rows, k, seed=7)
    weight = kernels.repack(kind, torch.from_numpy(raw), k)
    x = torch.randn(19, k, generator=torch.Generator().manual_seed(3))

    def product(part: torch.Tensor) -> torch.Tensor:
        return kernels.mm(kernels.quantize(part, isa), [weight.tiles], [weight.type_id], [rows], isa)

    alone = torch.cat([product(x[i:i + 1]) for i in range(19)])
    for count in (2, 3, 4, 5, 8, 9, 12, 16, 19):
        assert torch.equal(product(x[:count]), alone[:count]), count


# a byte of quants giving every weight its largest |u| (Q8_0 -128, IQ4's -127, MXFP4's 12), else 0xff
LARGEST = {"Q8_0": 0x80, "IQ4_NL": 0x00, "IQ4_XS": 0x00, "MXFP4": 0x77}


# Q6_K's int8 scales (bytes 192-207 of a block) at -128, the factor of the AVX2 path's vpmaddwd
SCALE_BYTES = {"Q6_K": (slice(192, 208), 0x80)}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", [*kernels.BLOCKS, "Q6_K/scale-128"])
def test_largest_weights_times_largest_activations_do_not_overflow(isa, kind):
    """Every weight at its type's largest magnitude and every activation at ±127: the int16 sums of
    vpmaddubsw hold as many chunks as they can without saturating, and no more."""
    kind, _, scaled = kind.partition("/")
    _, elems, size = kernels.BLOCKS[kind]
    raw = np.full((9, 512 // elems, size), LARGEST.get(kind, 0xff), dtype=np.uint8)
    if scaled:
        at, value = SCALE_BYTES[kind]
        raw[:, :, at] = value
    for at in F16_FIELDS[kind]:
        raw[:, :, at:at + 2] = np.array([0.01], dtype=np.float16).view(np.uint8)
    if kind == "MXFP4":
        raw[:, :, 0] = 127
    raw = raw.reshape(9, -1)
    weight = kernels.repack(kind, torch.from_numpy(raw), 512)
    w = reference(kind, raw).double()
    x = torch.ones(9, 512)
    x[1::2] = -1
    for rows in (1, 2, 9):  # the one-row, the fewer-row and the 8-row steps
        y = kernels.mm(kernels.quantize(x[:rows], isa), [weight.tiles], [weight.type_id], [9], isa)
        bound = 1e-5 * (x[:rows].abs().double() @ w.abs().T)
        assert ((y.double() - x[:rows].double() @ w.T).abs() <= bound).all(), rows


@pytest.mark.parametrize("isa", ISAS)
def test_linear_mixes_types_adds_bias_and_gates(isa):
    k = 512
    parts = [("Q5_0", 12), ("Q8_0", 8), ("Q6_K", 5)]  # as Qwen2.5's Q4_K_M mixes them in one q/k/v
    raws = [random_blocks(kind, rows, k, seed=i) for i, (kind, rows) in enumerate(parts)]
    layer = BlockLinear([kernels.repack(kind, torch.from_numpy(r), k) for (kind, _), r in zip(parts, raws, strict=True)], isa,
                        bias=torch.randn(25))
    w = torch.cat([reference(kind, r) for (kind, _), r in zip(parts, raws, strict=True)]).double()
    assert torch.equal(layer.weight_values(), w.float())
    x = torch.randn(2, 3, k)
    expected = quantized(x.view(6, k)) @ w.T + layer.bias.double()
    # float32 sums of 512 terms: the error scales with the sum of |terms|, not with the result
    scale = (x.view(6, k).abs().double() @ w.abs().T).max()
    assert (layer(x).view(6, 25).double() - expected).abs().max() <= 1e-5 * scale
    gate_up = torch.randn(4, 2 * k)
    gated = F.silu(gate_up[:, :k]) * gate_up[:, k:]
    y = kernels.linear(gate_up, [p.tiles for p in layer.parts], layer.types, layer.part_rows, None, isa,
                       kernels.SILU_MUL)
    scale = (gated.abs().double() @ w.abs().T).max()
    assert (y.double() - quantized(gated) @ w.T).abs().max() <= 1e-5 * scale


@pytest.mark.parametrize("m", [1, 3, 17])  # 17: VNNI's two tiles at a time, cut where a run ends
@pytest.mark.parametrize("n_threads", [2, 3])
def test_threads_share_a_matmul_out_without_changing_a_bit(m, n_threads):
    """Threads each read a range of a long matmul's tiles, then take halves from the back of the
    range with most left, across the parts' boundary: every output is the one thread's bit for
    bit, none left out or done twice."""
    k, parts = 8960, [("Q4_K", 997), ("Q6_K", 539)]  # a 1.5B down_proj's width, runs of up to 32 tiles
    packed = [kernels.repack(kind, torch.from_numpy(random_blocks(kind, rows, k, seed=i)), k)
              for i, (kind, rows) in enumerate(parts)]
    tiles, types, rows = [p.tiles for p in packed], [p.type_id for p in packed], [p.rows for p in packed]
    x, threads, isa = torch.randn(m, k), torch.get_num_threads(), kernels.best_isa()
    try:
        torch.set_num_threads(1)
        alone = kernels.linear(x, tiles, types, rows, None, isa)
        torch.set_num_threads(n_threads)
        shared = [kernels.linear(x, tiles, types, rows, None, isa) for _ in range(3)]
    finally:
        torch.set_num_threads(threads)
    assert alone.shape == (m, 1536) and alone.abs().min() > 0
    assert all(torch.equal(y, alone) for y in shared)


@pytest.mark.parametrize("kind", list(kernels.BLOCKS))
def test_select_keeps_the_same_blocks(kind):
    k, elems = 512, kernels.BLOCKS[kind][1]
    raw = random_blocks(kind, 20, k)
    layer = BlockLinear([kernels.repack(kind, torch.from_numpy(raw), k)], kernels.best_isa())
    rows = torch.tensor([3, 17, 0, 8])
    part = layer.select(rows=rows, columns=slice(256, 512))
    assert torch.equal(part.weight_values(), reference(kind, raw)[rows][:, 256:])
    with pytest.raises(ValueError, match=f"whole blocks of {elems}"):
        layer.select(columns=slice(0, elems // 2))


def test_fits_every_kernel_type_at_whole_blocks():
    for kind, (_, elems, _) in kernels.BLOCKS.items():
        assert fits(kind, elems) and fits(kind, 3 * elems) and not fits(kind, elems + 16)
    assert fits("MXFP4", 2880) and fits("IQ4_NL", 96) and not fits("IQ4_XS", 2880) and not fits("Q3_K", 896)
    assert not fits("IQ2_XS", 256) and not fits("F16", 256)


def test_mxfp4_exponents_at_the_ends_of_the_range():
    """E8M0 bytes 0 and 1 are subnormal scales, 255 is 2^127 (ggml's halved E8M0): every byte's
    values equal the gguf package's, and the products use the same scales on every path (x sized so
    the sums stay within float32)."""
    raw = random_blocks("MXFP4", 256, 32)
    raw[:, 0] = np.arange(256)
    weight = kernels.repack("MXFP4", torch.from_numpy(raw), 32)
    with np.errstate(over="ignore"):  # 2^127 · 12 is inf, in float32 as in the gguf package
        assert torch.equal(kernels.dequantize(weight, torch.arange(256)), reference("MXFP4", raw))
    for exponents, size in (([0, 1, 2, 3, 9], 1e30), ([248, 250, 252], 1e-30)):
        part = kernels.repack("MXFP4", torch.from_numpy(raw[exponents]), 32)
        w = reference("MXFP4", raw[exponents]).double()
        x = torch.randn(3, 32) * size
        for isa in ISAS:
            y = kernels.mm(kernels.quantize(x, isa), [part.tiles], [part.type_id], [len(exponents)], isa)
            scale = (x.abs().double() @ w.abs().T).amax(0)  # per row: the exponents are far apart
            assert ((y.double() - quantized(x) @ w.T).abs() <= 1e-5 * scale).all(), isa


def test_embedding_rows_and_tied_head_share_the_tiles():
    raw = random_blocks("Q8_0", 40, 64)
    table = BlockEmbedding(kernels.repack("Q8_0", torch.from_numpy(raw), 64), torch.float32)
    ids = torch.tensor([[39, 0], [5, 5]])
    assert torch.equal(table(ids), reference("Q8_0", raw)[ids])
    head = table.head(kernels.best_isa())
    assert head.tiles0.data_ptr() == table.tiles.data_ptr()
    with pytest.raises(RuntimeError, match="row 40 is not in 0..39"):
        table(torch.tensor([40]))


@pytest.mark.parametrize("mode", [kernels.SILU_MUL, kernels.GELU_TANH_MUL])
def test_gate_is_the_same_bits_on_every_isa_and_within_a_few_ulps(mode):
    """act(gate)·up: AVX2's 8-wide exp and the portable one give the same bits (a tail of 3 values
    past the last 8 included), within 16 float32 ulps of float64's silu / gelu-tanh wherever the
    result is not tiny (torch's own float32 gelu-tanh loses far more to 1 + tanh near -3), and a
    NaN stays NaN past the exp's clamp."""
    k = 8 * 1000 + 3
    gate = torch.cat([torch.linspace(-120, 120, k - 8), torch.tensor([float("nan"), float("inf"), 0.0, -0.0, 1e-40,
                                                                       -1e-40, 87.5, -88.5])])
    up = torch.randn(k, generator=torch.Generator().manual_seed(0))
    x = torch.cat([gate, up]).view(1, 2 * k)
    portable = kernels.glu(x, mode, 0)
    for isa in ISAS:
        assert torch.equal(kernels.glu(x, mode, isa).view(torch.int32), portable.view(torch.int32))
    g = gate.double()
    act = F.silu(g) if mode == kernels.SILU_MUL else F.gelu(g, approximate="tanh")
    exact = act * up.double()
    seen = torch.isfinite(exact) & (exact.abs() > 1e-3)
    assert seen.sum() > k // 4
    error = ((portable[0].double() - exact).abs() / exact.abs())[seen]
    assert error.max() <= 16 * torch.finfo(torch.float32).eps
    assert torch.isnan(portable[0, k - 8])


def test_float_helpers_equal_torch():
    x = torch.randn(3, 5, 64)
    w = torch.randn(64)
    norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(kernels.rms_norm(x, w, 1e-6), norm, atol=1e-6, rtol=1e-5)
    assert torch.allclose(kernels.rms_norm(x, w, 1e-6, 1.0), norm / w * (1 + w), atol=1e-5, rtol=1e-4)
    gate_up = torch.randn(3, 2, 128)
    assert torch.allclose(kernels.glu(gate_up), F.silu(gate_up[..., :64]) * gate_up[..., 64:], atol=1e-6)
    gelu = F.gelu(gate_up[..., :64], approximate="tanh") * gate_up[..., 64:]
    assert torch.allclose(kernels.glu(gate_up, kernels.GELU_TANH_MUL), gelu, atol=1e-6)
    heads = torch.randn(2, 3, 5, 16)  # (B, T, H, D)
    angles = torch.randn(2, 3, 1, 8)
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = heads[..., :8], heads[..., 8:]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    assert torch.allclose(kernels.rope(heads, cos, sin, 4), rotated[:, :, :4], atol=1e-6)


@pytest.mark.parametrize("keys", [1, 7, 300])
def test_attend_equals_sdpa_over_cache_views(keys):
    cache = torch.randn(2, 3, 512, 64)  # (B, n_kv, max_len, hd): attention reads a view of it
    k, v = cache[:, :, :keys], cache.flip(2)[:, :, :keys].contiguous()
    q = torch.randn(2, 1, 9, 64).transpose(1, 2)  # (B, n_head, 1, hd), not contiguous
    out = kernels.attend(q, k, v)
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert out.shape == expected.shape
    assert torch.allclose(out, expected, atol=1e-5)


def test_bad_shapes_are_one_line_errors():
    weight = kernels.repack("Q4_0", torch.from_numpy(random_blocks("Q4_0", 8, 64)), 64)
    with pytest.raises(RuntimeError, match="K must be a positive multiple of 32"):
        kernels.quantize(torch.randn(1, 40), 0)
    with pytest.raises(RuntimeError, match="not 8 rows of 128 values"):
        kernels.mm(kernels.quantize(torch.randn(1, 128), 0), [weight.tiles], [2], [8], 0)
    with pytest.raises(RuntimeError, match="unsupported block type 99"):
        torch.ops.nexttok_q.repack(torch.zeros(1, 18, dtype=torch.uint8), 99, 32)


def test_no_compiler_is_one_line_and_a_fallback(tmp_path):
    code = ("import shutil; shutil.which = lambda name: None\n"
            "from nexttok.models import kernels\n"
            "assert kernels.load() is None and not kernels.available()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip().splitlines() == [
        "nexttok: block kernels unavailable: no C++ compiler found (install g++); GGUF layers run on torch's kernels"]


@pytest.mark.skipif(not kernels.available(), reason="kernels not built")
def test_top_k_kept_is_topks():
    """The sampler's one-pass top-k keeps the tokens TopK keeps (ties with the k-th, never -inf; k past
    the vocabulary: all), ids ascending with their logits."""
    from nexttok.generation.stages import NEG_INF
    from nexttok.generation.stages.filters import TopK

    g = torch.Generator().manual_seed(0)
    for trial in range(120):
        n = int(torch.randint(1, 3000, (1,), generator=g))
        x = torch.randn(n, generator=g)
        if trial % 3 == 0:
            x = torch.round(x * 2) / 2  # many ties
        if trial % 5 == 0:
            x[torch.rand(n, generator=g) < 0.5] = NEG_INF
        k = int(torch.randint(1, n + 5, (1,), generator=g))
        kept = (TopK(k).apply(x) > NEG_INF).nonzero()[:, 0]
        ids, values = kernels.top_k_kept(x, k)
        assert torch.equal(ids, kept) and torch.equal(values, x[kept]), (trial, n, k)
    # vocabulary-sized rows and the usual small k, where only the blocks (of 64) whose max reaches
    # the k-th highest block max are searched: ascending, descending, all equal, ties, -inf runs
    rows = {"random": torch.randn(49_152, generator=g), "ascending": torch.arange(49_152.0),
            "descending": torch.arange(49_152.0).flip(0), "equal": torch.zeros(49_152),
            "ties": torch.round(torch.randn(151_936, generator=g) * 2) / 2,
            "ragged": torch.randn(50_001, generator=g)}
    rows["-inf runs"] = rows["random"].masked_fill(torch.arange(49_152) % 640 < 600, NEG_INF)
    for name, x in rows.items():
        for k in (1, 2, 40, 100, 700, 800):
            kept = (TopK(k).apply(x) > NEG_INF).nonzero()[:, 0]
            ids, values = kernels.top_k_kept(x, k)
            assert torch.equal(ids, kept) and torch.equal(values, x[kept]), (name, k)

