"""Mixture-of-experts speed: nexttok vs llama.cpp's own llama-bench on the same GGUF, which this script
writes itself: random weights in a real MoE model's layer shapes (OLMoE-1B-7B by default, or
Qwen3-30B-A3B with fewer layers to fit the machine), in Q4_0 or Q8_0 blocks.

    python bench/moe.py                                 # OLMoE-1B-7B shape, Q4_0, 3 rounds
    python bench/moe.py --shape qwen3-30b-a3b --layers 16 --kind Q8_0
    python bench/moe.py --llama-bin ~/.cache/nexttok-ref/llama.cpp/build-avx2/bin
    python bench/moe.py --file path/to/any.gguf     # an existing file instead (dense ones too)

llama.cpp's tools come from ../shared/tools/build-llama-cpp.sh (bench-only). The engines take
turns, round after round (the host's speed drifts by ±20% within minutes): each round runs
nexttok's decode (tg: 128 greedy tokens after a 16-token prompt, batch 1) and prefill (pp: a
512-token prompt) in a child process, then `llama-bench -p 512 -n 128` with the same thread count.
Printed: each round's tokens/s and ratio, the median ratio and its range, the bytes of weights a
decode step reads (attention, the router and k of E experts per layer, the output layer; the
roofline that implies at the bandwidth measured here), and the weights nexttok holds against the
file's size.

The weights are random file blocks (sane scales), not a trained model: speed depends on shapes,
types and routing, and a random router spreads tokens over the experts as evenly as a trained one
roughly does. The text it produces is noise.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = {  # the real models' config.json values
    "olmoe-1b-7b": dict(arch="olmoe", hidden=2048, layers=16, heads=16, kv_heads=16, head_dim=128, experts=64, top_k=8,
                        inner=1024, vocab=50304, theta=10000.0, norm_topk=False),
    "qwen3-30b-a3b": dict(arch="qwen3moe", hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, experts=128,
                          top_k=8, inner=768, vocab=151936, theta=1000000.0, norm_topk=True),
}
BLOCK = {"Q4_0": (32, 18, 0), "Q8_0": (32, 34, 0)}  # values and bytes per block, offset of the f16 scale


def random_blocks(kind: str, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, bytes per row) of valid blocks: random quants, f16 scales ~ N(0, 0.02)."""
    values, size, at = BLOCK[kind]
    raw = rng.integers(0, 256, size=(rows, k // values, size), dtype=np.uint8)
    scales = np.abs(rng.standard_normal((rows, k // values)) * 0.02).astype(np.float16)
    raw[:, :, at : at + 2] = scales.view(np.uint8).reshape(rows, k // values, 2)
    return raw.reshape(rows, -1)


def write_moe_gguf(path: Path, shape: dict, kind: str, layers: int | None) -> Path:
    """A GGUF of `shape` (layers overridden where given) in `kind` blocks, with a byte-level vocabulary."""
    import gguf

    s = dict(shape, layers=layers or shape["layers"])
    qtype = gguf.GGMLQuantizationType[kind]
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), s["arch"])
    a = s["arch"]
    for key, value in (("context_length", 4096), ("embedding_length", s["hidden"]), ("block_count", s["layers"]),
                       ("feed_forward_length", s["inner"]), ("attention.head_count", s["heads"]),
                       ("attention.head_count_kv", s["kv_heads"]), ("attention.key_length", s["head_dim"]),
                       ("attention.value_length", s["head_dim"]), ("expert_count", s["experts"]),
                       ("expert_used_count", s["top_k"]), ("expert_feed_forward_length", s["inner"])):
        writer.add_uint32(f"{a}.{key}", value)
    writer.add_float32(f"{a}.rope.freq_base", s["theta"])
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    _vocabulary(writer, s["vocab"])
    h, q, kv, e, f = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["experts"], s["inner"]

    def quantized(name: str, *dims: int) -> None:
        raw = random_blocks(kind, math.prod(dims[:-1]), dims[-1], rng)
        raw = raw.reshape(*dims[:-1], -1)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)

    def floats(name: str, *dims: int, value: float | None = None) -> None:
        array = np.full(dims, value, np.float32) if value is not None else rng.standard_normal(dims).astype(np.float32)
        writer.add_tensor(name, array)

    quantized("token_embd.weight", s["vocab"], h)
    floats("output_norm.weight", h, value=1.0)
    quantized("output.weight", s["vocab"], h)
    for i in range(s["layers"]):
        b = f"blk.{i}."
        floats(b + "attn_norm.weight", h, value=1.0)
        floats(b + "ffn_norm.weight", h, value=1.0)
        quantized(b + "attn_q.weight", q, h)
        quantized(b + "attn_k.weight", kv, h)
        quantized(b + "attn_v.weight", kv, h)
        quantized(b + "attn_output.weight", h, q)
        whole = s["arch"] == "olmoe"  # OLMoE norms all of q and all of k; Qwen3 each head
        floats(b + "attn_q_norm.weight", q if whole else s["head_dim"], value=1.0)
        floats(b + "attn_k_norm.weight", kv if whole else s["head_dim"], value=1.0)
        floats(b + "ffn_gate_inp.weight", e, h)
        quantized(b + "ffn_gate_exps.weight", e, f, h)
        quantized(b + "ffn_up_exps.weight", e, f, h)
        quantized(b + "ffn_down_exps.weight", e, h, f)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _vocabulary(writer, size: int) -> None:
    """256 byte-level tokens, a few merges (llama.cpp wants some), filler names up to `size`."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for b in range(256):
        chars.append(chr(b) if b in keep else chr(256 + extra))
        extra += b not in keep
    merges = [("t", "h"), ("h", "e"), ("i", "n")]
    tokens = chars + [a + b for a, b in merges] + [f"[PAD{i}]" for i in range(size - 256 - len(merges))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * size)
    writer.add_token_merges([f"{a} {b}" for a, b in merges])
    writer.add_eos_token_id(size - 1)
    writer.add_bos_token_id(size - 1)


def decode_bytes(path: Path) -> tuple[int, int]:
    """(bytes a decode step reads: every tensor but the experts', k/E of those, and one embedding
    row; the file's tensor bytes)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    counts = [reader.fields.get(f"{arch}.{n}") for n in ("expert_used_count", "expert_count")]
    k, e = (int(c.contents()) for c in counts) if all(counts) else (1, 1)  # a dense file: every tensor read
    read = total = 0
    names = {t.name for t in reader.tensors}
    for t in reader.tensors:
        total += int(t.n_bytes)
        if "_exps." in t.name:
            read += int(t.n_bytes) * k // e
        elif t.name == "token_embd.weight":
            row = int(t.n_bytes) // int(t.shape[-1])  # ggml order: (hidden, vocab); one row per token
            read += row if "output.weight" in names else int(t.n_bytes)  # a tied output layer reads it all
        else:
            read += int(t.n_bytes)
    return read, total


def ours(path: str, threads: int, prompt: int, new: int, queue) -> None:
    """One round of nexttok (a child process): decode and prefill tokens/s, weights held."""
    import torch

    from nexttok.checkpoints.loading import load_model
    from nexttok.checkpoints.weights import weight_bytes
    from nexttok.generation.prefill import prefill
    from nexttok.models.cache import KVCache

    torch.set_num_threads(threads)
    model = load_model(path)
    with torch.inference_mode():
        ids = torch.randint(0, 256, (1, prompt), generator=torch.Generator().manual_seed(0))
        prefill(model, KVCache.for_model(model.config, max_len=prompt + 1), ids[0, :32].tolist())  # warm-up
        cache = KVCache.for_model(model.config, max_len=prompt + 1)
        start = time.perf_counter()
        prefill(model, cache, ids[0].tolist())  # as `nexttok run` prefills: chunks of 128
        pp = prompt / (time.perf_counter() - start)
        cache = KVCache.for_model(model.config, max_len=16 + new + 1)
        logits = model(ids[:, :16], cache, last_only=True)
        token = logits[:, -1:].argmax(-1)
        for _ in range(4):  # warm-up steps
            token = model(token, cache, last_only=True)[:, -1:].argmax(-1)
        start = time.perf_counter()
        for _ in range(new - 4):
            token = model(token, cache, last_only=True)[:, -1:].argmax(-1)
        tg = (new - 4) / (time.perf_counter() - start)
    queue.put({"pp": pp, "tg": tg, "held": weight_bytes(model)})


def llama_bench(binary: Path, path: Path, threads: int, prompt: int, new: int) -> dict:
    out = subprocess.run([str(binary / "llama-bench"), "-m", str(path), "-t", str(threads), "-p", str(prompt),
                          "-n", str(new), "-r", "1", "-o", "json"], capture_output=True, text=True, timeout=3600,
                         env=dict(os.environ, LD_LIBRARY_PATH=str(binary)))
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed: {out.stderr.strip().splitlines()[-1:]}")
    rows = json.loads(out.stdout)
    return {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in rows}


def bandwidth(seconds: float = 1.0) -> float:
    """Read bandwidth (bytes/s) of this machine: sums over a 1 GiB buffer, as a decode step streams weights."""
    import torch

    x = torch.ones(1 << 28)  # 1 GiB of float32
    x.sum()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        x.sum()
        n += 1
    return n * x.numel() * 4 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="olmoe-1b-7b")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the real model's (to fit)")
    parser.add_argument("--kind", choices=sorted(BLOCK), default="Q4_0")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--file", type=Path, default=None, help="where to write (and keep) the GGUF")
    parser.add_argument("--llama-bin", type=Path,
                        default=Path.home() / ".cache/nexttok-ref/llama.cpp" / "build-avx2" / "bin")
    args = parser.parse_args()
    if not (args.llama_bin / "llama-bench").exists():
        alt = args.llama_bin.parent.parent / "build-avx512-vnni" / "bin"
        args.llama_bin = alt if (alt / "llama-bench").exists() else args.llama_bin
    if not (args.llama_bin / "llama-bench").exists():
        sys.exit(f"no llama-bench in {args.llama_bin}: run ../shared/tools/build-llama-cpp.sh first")
    tmp = tempfile.mkdtemp()
    try:
        path = args.file or Path(tmp) / "moe.gguf"
        if not path.exists():
            start = time.perf_counter()
            write_moe_gguf(path, SHAPES[args.shape], args.kind, args.layers)
            print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - start:.0f} s")
        report(args, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report(args, path: Path) -> None:
    from nexttok.models import kernels

    read, total = decode_bytes(path)
    bw = bandwidth()
    layers = args.layers or SHAPES[args.shape]["layers"]
    what = f"shape {args.shape} ({layers} layers), {args.kind}" if not args.file else f"{args.file.name}"
    print(f"{what}, {args.threads} threads, kernels {kernels.describe()}")
    print(f"a decode step reads {read / 1e6:.0f} MB of the file's {total / 1e6:.0f} MB of tensors; read bandwidth "
          f"{bw / 1e9:.1f} GB/s -> roofline {bw / read:.1f} tokens/s")
    context = multiprocessing.get_context("spawn")
    rows = []
    for r in range(args.rounds):
        queue = context.Queue()
        child = context.Process(target=ours, args=(str(path), args.threads, args.prompt, args.new, queue))
        child.start()
        mine = queue.get(timeout=3600)
        child.join()
        theirs = llama_bench(args.llama_bin, path, args.threads, args.prompt, args.new)
        rows.append((mine, theirs))
        print(f"round {r + 1}: decode nexttok {mine['tg']:.2f} / llama.cpp {theirs['tg']:.2f} tokens/s "
              f"({mine['tg'] / theirs['tg']:.2f}x); prefill {mine['pp']:.1f} / {theirs['pp']:.1f} "
              f"({mine['pp'] / theirs['pp']:.2f}x)", flush=True)
    for key, label in (("tg", "decode"), ("pp", "prefill")):
        ratios = [m[key] / t[key] for m, t in rows]
        print(f"{label}: median {statistics.median(ratios):.2f}x llama.cpp (range {min(ratios):.2f}-{max(ratios):.2f});"
              f" nexttok median {statistics.median(m[key] for m, _ in rows):.2f} tokens/s")
    held = rows[0][0]["held"]
    print(f"weights held by nexttok: {held / 1e6:.0f} MB for a {path.stat().st_size / 1e6:.0f} MB file "
          f"({held / path.stat().st_size:.3f}x)")


if __name__ == "__main__":
    main()
