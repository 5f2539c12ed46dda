"""The block kernels of this tree against an older commit's, in one process: a change of a few per
cent to csrc/qkern.h, measured on a host whose speed swings ±20% within minutes.

    python bench/kernels_ab.py --against HEAD                     # the uncommitted change, every K type
    python bench/kernels_ab.py --against 15683b2 --types Q4_K,Q6_K --rows 1,2,4,8
    python bench/kernels_ab.py --against HEAD~1 --shape 1000000,1536 --threads 2 --rows 1   # from memory

Both versions of qkern.h (each with its own qtypes.h and its q_avx2.cpp or q_vnni.cpp, so with its own
instruction-set flags) are compiled by g++ into one small program (bench/kernels_ab.cpp) in their own
namespaces. For each type and row count it times one matmul of random weights (N rows of K values,
repacked tiles as the extension holds them) by A (--against) and B (this tree): a median of repeated
calls each, A and B in turn over the rounds, the order turned round every other round. It prints B's
speed-up over A as the median (range) of the rounds' ratios, and the largest difference of their
outputs beside the largest output (float summation order may differ; a layout change shows as much
more). The default shape, 512 x 1536 at one thread, sits in the L2 cache: the kernels' arithmetic.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from nexttok.cpu import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
CSRC = "src/nexttok/models/kernels/csrc"
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13,
         "Q6_K": 14, "IQ4_NL": 20, "IQ4_XS": 23, "MXFP4": 39}
UNIT = {"avx2": "q_avx2.cpp", "avx512-vnni": "q_vnni.cpp", "amx": "q_amx.cpp"}
NAMESPACE = {"avx2": "nq_avx2", "avx512-vnni": "nq_vnni", "amx": "nq_amx"}


def source(ref: str | None, name: str) -> str:
    """A csrc file of this tree (ref None) or of a commit."""
    if ref is None:
        return (ROOT / CSRC / name).read_text()
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{CSRC}/{name}"], capture_output=True, text=True)
    if shown.returncode:
        raise SystemExit(f"kernels_ab: git cannot show {name} at {ref}: {shown.stderr.strip()}")
    return shown.stdout


def build(workdir: Path, against: str, isa: str, against_isa: str) -> Path:
    objects = []
    for side, ref, unit_isa in (("a", against, against_isa), ("b", None, isa)):
        folder = workdir / side
        folder.mkdir()
        for name in ("qkern.h", "qtypes.h"):
            (folder / name).write_text(source(ref, name))
        unit = source(ref, UNIT[unit_isa])
        namespace = NAMESPACE[unit_isa]
        if f"#define NQ_NS {namespace}" not in unit:
            raise SystemExit(f"kernels_ab: {UNIT[unit_isa]} at {ref or 'this tree'} does not define NQ_NS {namespace}")
        (folder / "unit.cpp").write_text(unit.replace(f"#define NQ_NS {namespace}", f"#define NQ_NS nq_{side}"))
        objects.append(folder / "unit.o")
        compile_step(["-c", str(folder / "unit.cpp"), "-o", str(objects[-1])])
    program = workdir / "kernels_ab"
    compile_step(["-I", str(workdir / "b"), str(ROOT / "bench" / "kernels_ab.cpp"), *map(str, objects), "-o",
                  str(program)])
    return program


def compile_step(arguments: list[str]) -> None:
    done = subprocess.run(["g++", "-O3", "-fno-math-errno", "-fopenmp", *arguments], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"kernels_ab: g++ failed: {done.stderr.strip()[:2000]}")


def measure(program: Path, kind: str, n: int, k: int, rows: int, rounds: int, threads: int) -> str:
    repeat = max(5, min(1000, int(1e9 / (n * k * rows))))  # ~20 ms of calls per median at L2 speed
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([str(program), str(TYPES[kind]), str(n), str(k), str(rows), str(rounds), str(repeat)],
                          capture_output=True, text=True, env=env)
    if done.returncode:
        return f"{kind:7s} {rows:2d} row(s): {done.stderr.strip()}"
    lines = done.stdout.split("\n")
    _, diff, _, largest = lines[0].split()
    ratios = [float(a) / float(b) for _, a, _, b in (line.split() for line in lines[1:] if line.startswith("A "))]
    return (f"{kind:7s} {rows:2d} row(s): B {statistics.median(ratios):.3f}x A ({min(ratios):.3f}-{max(ratios):.3f}),"
            f" outputs differ by {float(diff):.2g} of {float(largest):.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="the commit whose kernels are A (e.g. HEAD)")
    parser.add_argument("--types", default="Q4_K,Q5_K,Q6_K,Q3_K,Q2_K", help=f"of {','.join(TYPES)}")
    parser.add_argument("--rows", default="1,8", help="activation rows per matmul, comma-separated")
    parser.add_argument("--shape", default="512,1536", help="N,K of the weight (N a multiple of 8)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--isa", choices=list(UNIT), help="default: AVX-512 VNNI where the CPU has it, else AVX2")
    parser.add_argument("--against-isa", choices=list(UNIT), help="A's instruction set (default: --isa's); e.g. "
                        "--isa amx --against-isa avx512-vnni --against HEAD: AMX's steps against VNNI's")
    args = parser.parse_args()
    flags = cpu_flags()
    isa = args.isa or ("avx512-vnni" if {"avx512vl", "avx512_vnni"} <= flags else "avx2")
    against_isa = args.against_isa or isa
    needs = {"avx2": {"avx2"}, "avx512-vnni": {"avx2", "avx512vl", "avx512_vnni"},
             "amx": {"avx2", "avx512vl", "avx512_vnni", "amx_int8"}}
    if missing := [i for i in (isa, against_isa) if not needs[i] <= flags]:
        raise SystemExit(f"kernels_ab: this CPU does not run {missing[0]}")
    if not shutil.which("g++"):
        raise SystemExit("kernels_ab: needs g++")
    kinds = [t.strip() for t in args.types.split(",") if t.strip()]
    if unknown := [t for t in kinds if t not in TYPES]:
        raise SystemExit(f"kernels_ab: unknown type {unknown[0]!r}; known: {', '.join(TYPES)}")
    try:
        n, k = (int(v) for v in args.shape.split(","))
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        raise SystemExit(f"kernels_ab: --shape takes N,K and --rows numbers, got {args.shape!r} and {args.rows!r}"
                         ) from None
    if n < 8 or n % 8 or k < 256 or k % 256 or min(rows) < 1 or args.threads < 1 or args.rounds < 1:
        raise SystemExit("kernels_ab: N must be a multiple of 8, K of 256, and rows, --threads and --rounds "
                         f"at least 1 (got {n}x{k}, rows {args.rows}, {args.threads} threads, {args.rounds} rounds)")
    with tempfile.TemporaryDirectory(prefix="kernels_ab-") as workdir:
        program = build(Path(workdir), args.against, isa, against_isa)
        print(f"B = this tree ({isa}), A = {args.against} ({against_isa}); {n}x{k} weights, {args.threads} thread(s), "
              f"{args.rounds} rounds", flush=True)
        for kind in kinds:
            for count in rows:
                print(measure(program, kind, n, k, count, args.rounds, args.threads), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
