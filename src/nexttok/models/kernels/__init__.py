"""nexttok's own CPU kernels for GGUF blocks, built once from csrc/ by the machine's C++ compiler.

    repack(raw, kind)  a GGUF tensor's block rows (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
                       Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4) -> tiles of 8 rows, the same values
                       and scales reordered so that one register holds 4 weights of each of 8 rows
                       (csrc/qtypes.h); unpack undoes it
    quantize(x, mode)  activations (M, K) float32 -> int8 per group of 32 with a float scale and
                       the sums (optionally of act(gate)·up)
    mm(act, parts)     y (M, N) = x · Wᵀ over such tiles, several parts of mixed types at once
    linear(x, parts)   quantize and mm in one call (+ bias; optionally of act(gate)·up)
    moe_mlp(x, ...)    a mixture of experts' MLPs in one call (gate_up, activation, down, the
                       router-weighted sum), each token through its routed experts only, each
                       expert's weights read once for all of its tokens
    dequantize(...)    rows of a tiled weight as float32 (embedding lookups, checks, viewers)
    attend(q, k, v)    one new query per row over the cached keys (decode's attention; sinks optional)
    rms_norm, glu, rope  the float32 steps around the matmuls, one call each instead of the 4-10
                       small torch ops they take (a decode step of the default model is ~30 µs of
                       matmul per layer and was ~200 µs of such ops; `takes(x)` says when they apply)

The instruction set is picked at run time from what the CPU has (`best_isa()`): AVX-512 VNNI with
AMX-INT8 (prefill's 16-row steps on tiles, the same bits), AVX-512 VNNI (vpdpbusd), AVX2
(vpmaddubsw + vpmaddwd), or the portable C++ path; each call names its own, so tests run every path
the machine can. The extension is compiled by torch.utils.cpp_extension into
the nexttok cache (kernels/<hash of the sources and torch version>), which `scripts/setup.sh`
fills; later processes only load it. With no C++ compiler (or a failed build) `load()` says why in
one line on stderr and returns None: the loaders then fall back to torch's kernels.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from nexttok.cpu import cpu_flags
from nexttok.home import cache_home
from nexttok.models.kernels.slabs import tile_memory

CSRC = Path(__file__).parent / "csrc"
SOURCES = ("ops.cpp", "decode.cpp", "select.cpp", "q_generic.cpp", "q_avx2.cpp", "q_vnni.cpp", "q_amx.cpp")
CFLAGS = ("-O3", "-fno-math-errno", "-fopenmp")
ISAS = ("portable", "avx2", "avx512-vnni", "amx")  # the isa argument's values 0, 1, 2, 3
# ggml type numbers of the block formats the kernels run, with (values, bytes) per block
BLOCKS = {"Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24),
          "Q8_0": (8, 32, 34), "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144),
          "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "IQ4_NL": (20, 32, 18), "IQ4_XS": (23, 256, 136),
          "MXFP4": (39, 32, 17)}
PLAIN, SILU_MUL, GELU_TANH_MUL = 0, 1, 2  # what linear / quantize / glu take of x
SWIGLU_OAI = 3  # moe_mlp's gpt-oss activation
TILE = 8  # rows per tile

_state: dict[str, object] = {}


def build_dir() -> Path:
    """Where this build of the kernels lives in the nexttok cache: keyed by torch's version, the
    compiler flags, the sources and where they are (ninja's build file names the sources by path, so two checkouts
    sharing one folder would rebuild it in turn)."""
    digest = hashlib.sha256(torch.__version__.encode() + str(CSRC.resolve()).encode() + " ".join(CFLAGS).encode())
    for name in sorted(p.name for p in CSRC.iterdir()):
        digest.update(name.encode() + (CSRC / name).read_bytes())
    return cache_home() / "kernels" / digest.hexdigest()[:16]


def load(verbose: bool = False):
    """The compiled extension module (building it the first time), or None with the reason said
    once on stderr."""
    if "module" in _state:
        return _state["module"]
    module, why = None, None
    if not shutil.which("c++") and not shutil.which("g++"):
        why = "no C++ compiler found (install g++)"
    else:
        try:
            module = _compile(verbose)
        except Exception as e:  # a failed build is a slower model, not a crash
            why = f"the build failed ({type(e).__name__}: {str(e).strip().splitlines()[-1][:200]})"
    if why:
        print(f"nexttok: block kernels unavailable: {why}; GGUF layers run on torch's kernels", file=sys.stderr)
    _state["module"] = module
    return module


def _compile(verbose: bool):
    directory = build_dir()  # hashes every source: once
    built = directory / "nexttok_q.so"
    if built.is_file() and not verbose:  # built before from these very sources: imported as it is, without
        with contextlib.suppress(ImportError):  # torch.utils.cpp_extension (and setuptools), a tenth of a second
            spec = importlib.util.spec_from_file_location("nexttok_q", built)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _register_fakes()
            return module
    from torch.utils.cpp_extension import load as build

    directory.mkdir(parents=True, exist_ok=True)
    module = build(name="nexttok_q", sources=[str(CSRC / s) for s in SOURCES], build_directory=str(directory),
                   extra_cflags=list(CFLAGS), extra_ldflags=["-fopenmp"],
                   verbose=verbose)
    _register_fakes()
    return module


def available() -> bool:
    return load() is not None


def row_ready(x: torch.Tensor) -> bool:
    """x is one float32 row on the CPU and the kernels are already imported (this never starts a
    build: a sampler over a model that has not used them keeps to torch)."""
    return x.dim() == 1 and x.dtype == torch.float32 and x.device.type == "cpu" and _state.get("module") is not None


def takes(x: torch.Tensor) -> bool:
    """The float32 helpers (rms_norm, glu, rope) run on x: float32 on the CPU, kernels built."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and load() is not None


def _eager():
    """The module's functions called straight (no torch.ops dispatch) outside torch.compile's
    tracing, which needs the registered ops."""
    return torch.ops.nexttok_q if torch.compiler.is_compiling() else _state["module"]


def best_isa() -> int:
    """The fastest instruction set this CPU runs: 3 AVX-512 VNNI with AMX-INT8 (prefill's 16-row steps
    on tiles; Linux must grant the tile state), 2 AVX-512 VNNI, 1 AVX2, 0 portable."""
    if "isa" not in _state:
        features = load().features()
        _state["isa"] = 3 if features & 4 else 2 if features & 2 else 1 if features & 1 else 0
    return _state["isa"]


FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "amx_tile",
            "amx_int8")  # the x86 features the kernels (or llama.cpp's) may use


def describe() -> str:
    """What the kernels dispatch to here, whether they request weights ahead (software prefetch:
    AVX2 and AMX always, AVX-512 VNNI on Intel's CPUs only), and the CPU's features they could use:
    "avx512-vnni, prefetching (CPU: avx2 fma f16c avx512f ... amx_int8)"."""
    flags = cpu_flags()
    have = " ".join(f for f in FEATURES if f in flags) or "features unknown"
    if not available():
        return f"unavailable (torch's kernels) (CPU: {have})"
    isa = best_isa()
    return f"{ISAS[isa]}{', prefetching' if load().prefetching(isa) else ''} (CPU: {have})"


@dataclass(frozen=True)
class Activations:
    """x (M, K) quantized: q int8 (M, K), d float32 (M, K/32), s int16 sums per 16 (M, K/16),
    ds = d · (sum per 32) float32 (M, K/32)."""

    q: torch.Tensor
    d: torch.Tensor
    s: torch.Tensor
    ds: torch.Tensor


@dataclass(frozen=True)
class Tiled:
    """A weight of `rows` rows of `k` values of one block type, repacked in tiles of 8 rows: one
    matrix, or `matrices` of rows / matrices rows each (a mixture's experts), each repacked alone."""

    kind: str
    tiles: torch.Tensor  # ((rows + 7) // 8, bytes per tile) uint8
    rows: int
    k: int
    matrices: int = 1

    @property
    def type_id(self) -> int:
        return BLOCKS[self.kind][0]


def repack(kind: str, raw: torch.Tensor, k: int, done: Callable[[int, int], None] | None = None,
           chunk_bytes: int = 1 << 24, matrices: int = 1) -> Tiled:
    """raw (rows, bytes per row) uint8, the file's blocks -> Tiled, about chunk_bytes of the file
    at a time; done(first, stop) is told each run of rows finished (the loader then lets go of the
    file's pages of those rows: a weight never sits in memory twice). matrices > 1: the rows are
    that many matrices (experts) of whole tiles, one after another, each laid out alone."""
    type_id, rows = BLOCKS[kind][0], raw.shape[0]
    if matrices < 1 or rows % matrices or (matrices > 1 and rows // matrices % TILE):
        raise ValueError(f"{rows} rows are not {matrices} matrices of whole tiles of {TILE}")
    module, each = load(), rows // matrices
    shape = (matrices * ((each + TILE - 1) // TILE), module.tile_bytes(type_id, k))
    tiles = tile_memory(shape[0] * shape[1]).view(shape)  # on 2 MiB pages, faulted in as the repack writes
    # runs of whole groups of tiles (long rows keep theirs piece by piece: csrc/qtypes.h) within a matrix
    whole = TILE * module.GROUP
    step = max(whole, chunk_bytes // max(1, raw.shape[1]) // whole * whole)
    for start in range(0, rows, max(1, each)):  # each matrix
        for first in range(start, start + each, step):
            stop = min(start + each, first + step)
            torch.ops.nexttok_q.repack_into(raw[first:stop], type_id, k, tiles[first // TILE:(stop + TILE - 1) // TILE])
            if done is not None:
                done(first, stop)
    return Tiled(kind, tiles, rows, k, matrices)


def unpack(weight: Tiled, rows: torch.Tensor) -> torch.Tensor:
    """Rows (n,) of a tiled weight as the file's own bytes (n, bytes per row)."""
    return torch.ops.nexttok_q.unpack(weight.tiles, weight.type_id, weight.rows, rows, weight.k, weight.matrices)


def quantize(x: torch.Tensor, isa: int, mode: int = PLAIN) -> Activations:
    """x (M, K) float32 -> Activations; SILU_MUL / GELU_TANH_MUL take x = [gate | up] (M, 2K)
    and quantize act(gate)·up."""
    return Activations(*torch.ops.nexttok_q.quantize(x, mode, isa))


def mm(act: Activations, tiles: list[torch.Tensor], types: list[int], rows: list[int], isa: int) -> torch.Tensor:
    """(M, N) float32 = x · Wᵀ, W the parts' rows stacked (each part's tiles, type id and rows)."""
    return torch.ops.nexttok_q.mm(act.q, act.d, act.s, act.ds, tiles, types, rows, isa)


def linear(x: torch.Tensor, tiles: list[torch.Tensor], types: list[int], rows: list[int],
           bias: torch.Tensor | None, isa: int, mode: int = PLAIN) -> torch.Tensor:
    """(M, N) float32 = q(x) · Wᵀ (+ bias), x (M, K) contiguous float32 quantized inside (mode
    SILU_MUL / GELU_TANH_MUL: x = [gate | up] (M, 2K), act(gate)·up quantized)."""
    return _eager().linear(x, tiles, types, rows, bias, mode, isa)


def top_k_kept(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids ascending, their logits) of the tokens top-k keeps of a float32 row (vocab,): the k
    highest, ties with the k-th too, never a -inf one; in two passes (select.cpp), where
    torch.topk, a mask and nonzero took 0.22 ms on a 49k vocabulary."""
    return _state["module"].top_k_kept(logits.contiguous(), k)


def pick(probs: torch.Tensor, u: float) -> int:
    """sampling.pick's inverse-CDF draw over a float32 row of probabilities (select.cpp), in one call."""
    return _state["module"].pick(probs.contiguous(), u)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) · (weight + offset) over the last dimension, float32."""
    return _eager().rms_norm(x, weight, eps, offset)


def glu(x: torch.Tensor, mode: int = SILU_MUL, isa: int | None = None) -> torch.Tensor:
    """act(gate) · up for x = [gate | up] (..., 2K) -> (..., K): silu (SILU_MUL) or gelu-tanh; every
    isa (default: best_isa()) gives the same bits, AVX2's 8 values at a time."""
    return _eager().glu(x, mode, best_isa() if isa is None else isa)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n: int) -> torch.Tensor:
    """The first n heads of x (B, T, H, D) rotated by RoPE: cos, sin (B, T, 1, D/2) -> (B, T, n, D)."""
    return _eager().rope(x, cos, sin, n)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q·kᵀ/√D)·v for one query per row over every key: q (B, H, 1, D), k and v
    (B, Hkv, S, D) float32 with contiguous rows (cache views do) -> (B, H, 1, D). sinks (H,):
    each head's sink logit joins its softmax (gpt-oss)."""
    return _eager().attend(q, k, v, sinks, best_isa())


def moe_mlp(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: list[Tiled], down: list[Tiled],
            n_experts: int, isa: int, mode: int = SILU_MUL, alpha: float = 1.702, limit: float = 7.0,
            gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None) -> torch.Tensor:
    """A mixture of experts' MLPs in one call: x (T, H) float32, the router's ids and weights (T, k)
    -> (T, H) = Σ_j weights[:, j] · down_e(act(gate_up_e(x) + b) + b'), e = ids[:, j]. gate_up's parts
    hold n_experts × [gate | up] rows (each part E × its rows), down's n_experts × H rows; act:
    SILU_MUL, or SWIGLU_OAI (gpt-oss: gate clamped above at limit, up to ±limit, gate·σ(alpha·gate)·(up + 1))."""
    def parts(tiled: list[Tiled]) -> tuple[list[torch.Tensor], list[int], list[int]]:
        if any(p.matrices != n_experts for p in tiled):  # each expert's tiles are laid out alone
            raise ValueError(f"moe_mlp: expert weights must be repacked as {n_experts} matrices "
                             f"(kernels.repack(..., matrices={n_experts})), not {[p.matrices for p in tiled]}")
        return [p.tiles for p in tiled], [p.type_id for p in tiled], [p.rows // n_experts for p in tiled]

    return torch.ops.nexttok_q.moe_mlp(x, ids, weights, *parts(gate_up), *parts(down), n_experts, gate_up_bias,
                                       down_bias, mode, alpha, limit, isa)


def dequantize(weight: Tiled, rows: torch.Tensor) -> torch.Tensor:
    """Rows (n,) of a tiled weight as float32 (n, k): exactly the file's values."""
    return torch.ops.nexttok_q.dequantize(weight.tiles, weight.type_id, weight.rows, rows, weight.k, weight.matrices)


def _register_fakes() -> None:
    """Shapes of the ops for torch.compile's tracing (compiled.py)."""
    if _state.get("fakes"):
        return
    _state["fakes"] = True

    @torch.library.register_fake("nexttok_q::quantize")
    def _(x, mode, isa):
        k = x.shape[1] if mode == PLAIN else x.shape[1] // 2
        m = x.shape[0]
        return (x.new_empty((m, k), dtype=torch.int8), x.new_empty((m, k // 32)),
                x.new_empty((m, k // 16), dtype=torch.int16), x.new_empty((m, k // 32)))

    @torch.library.register_fake("nexttok_q::mm")
    def _(q, d, s, ds, weights, types, rows, isa):
        return q.new_empty((q.shape[0], sum(rows)), dtype=torch.float32)

    @torch.library.register_fake("nexttok_q::linear")
    def _(x, weights, types, rows, bias, mode, isa):
        return x.new_empty((x.shape[0], sum(rows)))

    @torch.library.register_fake("nexttok_q::rms_norm")
    def _(x, weight, eps, offset):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake("nexttok_q::glu")
    def _(x, mode, isa):
        return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))

    @torch.library.register_fake("nexttok_q::rope")
    def _(x, cos, sin, n):
        return x.new_empty((*x.shape[:2], n, x.shape[3]))

    @torch.library.register_fake("nexttok_q::moe_mlp")
    def _(x, ids, weights, gate_up, gt, gr, down, dt, dr, n_experts, gb, db, mode, alpha, limit, isa):
        return torch.empty_like(x)

    @torch.library.register_fake("nexttok_q::attend")
    def _(q, k, v, sinks, isa):
        return q.new_empty((q.shape[0], 1, q.shape[1], q.shape[3])).transpose(1, 2)

    @torch.library.register_fake("nexttok_q::dequantize")
    def _(w, type_id, n, rows, k, matrices=1):
        return w.new_empty((rows.numel(), k), dtype=torch.float32)
