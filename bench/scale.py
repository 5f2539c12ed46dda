"""Scale: nexttok vs llama-bench on a random-weight model the size people run, and the memory roofline.

    python bench/scale.py                          # Qwen2.5-1.5B's shape, Q4_K_M, 5 rounds
    python bench/scale.py --type Q8_0,Q6_K,Q5_K_M,Q4_0 --keep   # other files; keep the F16 they come from
    python bench/scale.py --shape tiny --rounds 1  # the pipeline checked in seconds

Writes a GGUF in the shape's architecture (llama.cpp's tensor names and "<arch>." metadata, F16
weights ~N(0, 0.02), norms 1, the tokenizer metadata copied from the Qwen2.5-Coder-0.5B GGUF, whose
151936-token vocabulary is Qwen2.5's), quantizes it with llama.cpp's llama-quantize to Q4_K_M and
caches that under ~/.cache/nexttok-ref/scale/<shape>-q4_k_m.gguf, so later runs reuse it (--type names
other llama-quantize types, each cached the same way, and a summary row per file ends the report). Then
nexttok.bench_native.measure alternates nexttok and llama-bench over --rounds (medians and ranges),
and the roofline is printed: in each round, right before and right after nexttok's greedy decode, the
memory's read bandwidth is measured and the larger taken (on a Zen 4 VM it flips between ~35 and ~65
GB/s within seconds), and that round's decode times the
bytes nexttok's loaded model reads per step (nexttok.benchmark.weight_bytes) is taken as a % of it;
the median and range of those %.
Random weights change no timing: every kernel reads the same bytes whatever the values.

Only the Qwen shape (and tiny) are supported: --shape llama-3.2-3b needs a Llama-3 tokenizer's
GGUF metadata, and none is available offline here (no Llama-3 GGUF in the cache).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REFERENCE = Path.home() / ".cache" / "nexttok-ref"
TOKENIZER_SOURCE = REFERENCE / "qwen" / "qwen2.5-coder-0.5b-q4_k_m.gguf"
CACHE = REFERENCE / "scale"


@dataclass(frozen=True)
class Shape:
    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float
    rms_eps: float
    context: int
    qkv_bias: bool = True


SHAPES = {
    "qwen2.5-1.5b": Shape("qwen2", 1536, 28, 12, 2, 128, 8960, 151936, 1e6, 1e-6, 32768),
    "tiny": Shape("qwen2", 256, 2, 4, 2, 64, 512, 151936, 1e6, 1e-6, 4096),
}
UNSUPPORTED = {"llama-3.2-3b": "needs a Llama-3 tokenizer (128256 tokens) and no Llama-3 GGUF is available "
                               "offline to copy its tokenizer metadata from"}


def tensor_shapes(shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """llama.cpp's names and numpy shapes (rows = output features), in its file order; tied embeddings."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (shape.vocab, shape.hidden))]
    for n in range(shape.layers):
        block = [("attn_norm.weight", (shape.hidden,)), ("attn_q.weight", (q, shape.hidden)),
                 ("attn_k.weight", (kv, shape.hidden)), ("attn_v.weight", (kv, shape.hidden))]
        if shape.qkv_bias:
            block += [("attn_q.bias", (q,)), ("attn_k.bias", (kv,)), ("attn_v.bias", (kv,))]
        block += [("attn_output.weight", (shape.hidden, q)), ("ffn_norm.weight", (shape.hidden,)),
                  ("ffn_gate.weight", (shape.intermediate, shape.hidden)),
                  ("ffn_up.weight", (shape.intermediate, shape.hidden)),
                  ("ffn_down.weight", (shape.hidden, shape.intermediate))]
        out += [(f"blk.{n}.{name}", dims) for name, dims in block]
    return out + [("output_norm.weight", (shape.hidden,))]


def _values(name: str, dims: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """F16 weights ~N(0, 0.02), F32 norms of 1 and biases ~N(0, 0.02); big ones made in row chunks."""
    if name.endswith("norm.weight"):
        return np.ones(dims, dtype=np.float32)
    if len(dims) == 1:
        return (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float32)
    out = np.empty(dims, dtype=np.float16)
    step = max(1, (1 << 24) // dims[1])
    for start in range(0, dims[0], step):
        rows = min(step, dims[0] - start)
        out[start:start + rows] = rng.standard_normal((rows, dims[1]), dtype=np.float32) * 0.02
    return out


def _copy_tokenizer(writer, source: Path, vocab: int) -> None:
    """Every tokenizer.* key of `source`, its vocabulary checked against the shape's."""
    from nexttok.checkpoints.gguf.metadata import gguf_reader

    reader = gguf_reader(source)
    tokens = reader.fields["tokenizer.ggml.tokens"]
    if len(tokens.data) != vocab:
        raise ValueError(f"{source} has {len(tokens.data)} tokens, the shape {vocab}")
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(key, field.contents(), field.types[0], sub)


def write_gguf(path: Path, shape: Shape, *, tokenizer: Path = TOKENIZER_SOURCE, seed: int = 0) -> None:
    """A random-weight F16 GGUF in `shape`, written one tensor at a time (memory: the largest one)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), shape.arch)
    writer.add_name(f"nexttok random {shape.arch}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    a = shape.arch
    for key, value in {"context_length": shape.context, "embedding_length": shape.hidden,
                       "block_count": shape.layers, "feed_forward_length": shape.intermediate,
                       "attention.head_count": shape.heads, "attention.head_count_kv": shape.kv_heads}.items():
        writer.add_uint32(f"{a}.{key}", value)
    writer.add_float32(f"{a}.rope.freq_base", shape.rope_theta)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", shape.rms_eps)
    _copy_tokenizer(writer, tokenizer, shape.vocab)
    layout = tensor_shapes(shape)
    for name, dims in layout:
        f16 = len(dims) == 2
        dtype = np.float16 if f16 else np.float32
        writer.add_tensor_info(name, dims, np.dtype(dtype), int(np.prod(dims)) * np.dtype(dtype).itemsize,
                               gguf.GGMLQuantizationType.F16 if f16 else gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, dims in layout:
        writer.write_tensor_data(_values(name, dims, rng))
    writer.close()


def quantized(shape_name: str, binary: Path, kind: str) -> Path:
    """The cached `kind` (a llama-quantize type: Q4_K_M, Q8_0, ...) file of `shape_name`, written from
    the F16 one (itself written first where there is none) and quantized where there is none."""
    CACHE.mkdir(parents=True, exist_ok=True)
    out = CACHE / f"{shape_name}-{kind.lower()}.gguf"
    if out.is_file():
        print(f"reusing {out}", flush=True)
        return out
    f16 = CACHE / f"{shape_name}-f16.gguf"
    if not f16.is_file():
        start = time.perf_counter()
        write_gguf(f16, SHAPES[shape_name])
        print(f"wrote {f16} ({f16.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - start:.0f} s", flush=True)
    start = time.perf_counter()
    partial = out.with_suffix(".partial")
    done = subprocess.run([str(binary / "llama-quantize"), str(f16), str(partial), kind], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"llama-quantize to {kind} failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    partial.rename(out)
    print(f"quantized to {out} ({out.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - start:.0f} s",
          flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-1.5b", choices=[*SHAPES, *UNSUPPORTED])
    parser.add_argument("--type", default="Q4_K_M",
                        help="llama-quantize types, comma-separated (e.g. Q4_K_M,Q8_0,Q6_K,Q5_K_M,Q4_0,Q3_K_M)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--keep", action="store_true", help="keep the F16 file the quantized ones are made from")
    parser.add_argument("--llama-cpp-bin", default=None)
    args = parser.parse_args()
    if args.shape in UNSUPPORTED:
        sys.exit(f"--shape {args.shape}: {UNSUPPORTED[args.shape]}")
    from nexttok.bench_native import llama_cpp_bin

    binary = llama_cpp_bin(args.llama_cpp_bin)
    if binary is None or not (binary / "llama-quantize").is_file():
        sys.exit("no llama.cpp build with llama-quantize (build it with ../shared/tools/build-llama-cpp.sh)")
    kinds = [kind.strip().upper() for kind in args.type.split(",") if kind.strip()]
    paths = {kind: quantized(args.shape, binary, kind) for kind in kinds}
    if not args.keep and "F16" not in kinds:
        (CACHE / f"{args.shape}-f16.gguf").unlink(missing_ok=True)
    summary = [f"{'file':<10}{'GB':>6}{'decode greedy':>22}{'sampled':>22}{'prefill':>22}{'roofline':>10}"]
    for kind, path in paths.items():
        summary.append(_one(kind, path, binary, args))
    print("\n".join(summary))


def _one(kind: str, path: Path, binary: Path, args) -> str:
    """One file's table (printed) and its summary row: the ratios' medians (ranges), and the roofline's
    % per round (the read bandwidth measured in the same round, the larger of right before and right
    after nexttok's decode)."""
    from nexttok.bench_native import measure, table

    memory: list[tuple[float, int, bool]] = []
    measured = measure(str(path), binary, threads=args.threads, prompt=args.prompt_tokens, new=args.new_tokens,
                       rounds=args.rounds, memory=memory)
    print(table(measured, f"nexttok vs llama-bench on {path}, {args.threads} threads, {args.rounds} rounds "
                "alternating which runs first; medians (range)", args.prompt_tokens, args.new_tokens))
    read, steady = [gbs for gbs, _, _ in memory], [agreed for _, _, agreed in memory]
    held = memory[0][1]
    shares = [100 * tps * held / (gbs * 1e9) for tps, gbs in zip(measured["decode_tps"].ours, read, strict=True)]
    print(f"roofline: nexttok's decode reads {held / 1e9:.3f} GB a token; the memory read {statistics.median(read):.1f}"
          f" GB/s ({min(read):.1f}-{max(read):.1f}) over the rounds; decode = {statistics.median(shares):.0f}% "
          f"({min(shares):.0f}-{max(shares):.0f}%) of what each round's bandwidth allows", flush=True)
    print(by_state(read, shares, measured["decode_tps"].ratios, steady) + "\n", flush=True)
    return (f"{kind:<10}{path.stat().st_size / 1e9:>6.2f}{measured['decode_tps'].ratio():>22}"
            f"{measured['sampled_tps'].ratio():>22}{measured['prefill_tps'].ratio():>22}"
            f"{statistics.median(shares):>9.0f}%")


def by_state(read: list[float], shares: list[float], ratios: list[float], steady: list[bool]) -> str:
    """The rounds split by the memory's state where its bandwidth took two levels (the larger at least
    1.4x the smaller: a Zen 4 VM's ~35 and ~60 GB/s): each state's roofline % and greedy decode ratio,
    medians (ranges), over the rounds whose bandwidth before and after nexttok's decode agreed
    (steady); a round that straddled a flip is left out, as its decode may have run in either state.
    In the slower state both engines are bound by the memory, so their ratio nears 1; in the faster
    one llama.cpp's decode is bound by its arithmetic."""
    if max(read) < 1.4 * min(read):
        return "the memory held one state over the rounds"
    cut = (max(read) + min(read)) / 2
    lines = [f"by the memory's state ({steady.count(False)} of {len(read)} rounds straddled a flip, left out):"]
    for name, fast in ((f"memory >= {cut:.0f} GB/s", True), (f"memory < {cut:.0f} GB/s", False)):
        mine = [i for i, gbs in enumerate(read) if (gbs >= cut) == fast and steady[i]]
        if not mine:
            lines.append(f"  {name}: no steady round")
            continue
        share, ratio = [shares[i] for i in mine], [ratios[i] for i in mine]
        lines.append(f"  {name}: {len(mine)} rounds, roofline {statistics.median(share):.0f}% ({min(share):.0f}-"
                     f"{max(share):.0f}%), greedy decode {statistics.median(ratio):.2f}x ({min(ratio):.2f}-"
                     f"{max(ratio):.2f}) llama-bench")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
