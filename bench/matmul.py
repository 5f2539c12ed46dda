"""The block kernels' matmuls alone, per file type, on the files bench/scale.py writes (Qwen2.5-1.5B's
shape, random weights, quantized by llama.cpp's llama-quantize).

    python bench/scale.py --type Q6_K,Q3_K_M --rounds 1     # writes (and caches) the files first
    python bench/matmul.py Q6_K,Q3_K_M                      # then times their layers' matmuls
    PYTHONPATH=OLDER_TREE/src python bench/matmul.py Q6_K   # the same on another commit's kernels

For each file: one layer's linears (qkv, o, gate_up, down of layer 1) at one activation row and at 512
rows, medians of repeated calls, as GOPS (2·rows·in·out operations a second): at one row the layer's
weights sit in the L3 cache, so that is the kernels' arithmetic; at 512 rows, prefill's. Then every
linear of the model at one row, one after the other (the file from memory, as a decode step reads
it), as GB/s of the bytes those weights hold, beside the read bandwidth measured in the same minute.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

CACHE = Path.home() / ".cache" / "nexttok-ref" / "scale"


def median_seconds(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def one_file(path: Path) -> str:
    from nexttok.benchmark import measure_read_bandwidth
    from nexttok.checkpoints.loading import load_model
    from nexttok.models.block_quant import BlockLinear

    model = load_model(str(path))
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, BlockLinear)]
    layer = [m for name, m in linears if "layers.1." in name]
    out = [f"{path.name}: layer 1's {len(layer)} linears"]
    with torch.inference_mode():
        for rows, repeat in ((1, 50), (512, 5)):
            seconds = ops = 0.0
            for m in layer:
                x = torch.randn(rows, m.in_features)
                seconds += median_seconds(lambda m=m, x=x: m(x), repeat)
                ops += 2 * rows * m.in_features * m.out_features
            out.append(f"  {rows:>3} rows: {seconds * 1e3:7.2f} ms, {ops / seconds / 1e9:5.0f} GOPS")
        inputs = [(m, torch.randn(1, m.in_features)) for _, m in linears]
        held = sum(t.numel() * t.element_size() for m, _ in inputs for t in [*m.parameters(), *m.buffers()])
        seconds = median_seconds(lambda: [m(x) for m, x in inputs], 5)
    bandwidth = measure_read_bandwidth()
    out.append(f"  every linear at one row: {seconds * 1e3:.1f} ms for {held / 1e9:.3f} GB, "
               f"{held / seconds / 1e9:.1f} GB/s; the memory read {bandwidth:.1f} GB/s")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("types", help="llama-quantize types, comma-separated, e.g. Q6_K,Q3_K_M,Q2_K")
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for kind in (k.strip() for k in args.types.split(",") if k.strip()):
        path = CACHE / f"{args.shape}-{kind.lower()}.gguf"
        if not path.is_file():
            raise SystemExit(f"{path} is missing: write it with python bench/scale.py --type {kind} --rounds 1")
        print(one_file(path), flush=True)


if __name__ == "__main__":
    main()
