"""Start-up: wall time from the command to its first token, nexttok against llama.cpp's llama-cli.

    python bench/startup.py                      # the default model, 5 rounds
    python bench/startup.py --against 51e7766    # also an older commit of this repository, alternating
    python bench/startup.py --model FILE.gguf --rounds 9

Every round starts each of these once, one after the other, the order turned round every other round:
- `python -c "import torch"`: the floor that no program built on PyTorch goes under;
- `nexttok run PROMPT --max-tokens 1 --no-server` from this tree (and from --against's, checked out in a
  temporary git worktree): the wall time to the first byte on stdout, which is the token, and to the exit;
- llama.cpp's own `llama-cli -m FILE -p PROMPT -n 1 -st --simple-io` where found (../shared/tools/
  build-llama-cpp.sh, --llama-cpp-bin or $NEXTTOK_LLAMA_CPP_BIN): the wall time to its exit, which is
  an upper bound on its first token (it applies the chat template and warms up first, as `run` does not).
One unmeasured start of each first. Medians (range). Then, once, where nexttok's start goes, phase
by phase in one fresh process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = """
import time
marks = [("python started", time.perf_counter())]
import torch
marks.append(("import torch", time.perf_counter()))
import nexttok.cli
from nexttok.checkpoints.loading import load_checkpoint
from nexttok.checkpoints.sources import resolve_checkpoint
marks.append(("import nexttok.cli and the loader", time.perf_counter()))
path = str(resolve_checkpoint({model!r}))
checkpoint = load_checkpoint(path)
marks.append(("load_checkpoint (tokenizer, weights, kernels)", time.perf_counter()))
from nexttok.generation.loop import stream
from nexttok.generation.sampling import SamplingParams
ids = checkpoint.tokenizer.encode({prompt!r}, add_special=True)
next(iter(stream(checkpoint.model, checkpoint.tokenizer, ids, SamplingParams(temperature=0), max_tokens=1,
                 stop_token_ids=[], top_n=0, logprobs=False)))
marks.append(("the first token (prefill, pick)", time.perf_counter()))
for (_, before), (name, at) in zip(marks, marks[1:]):
    print(f"{{name:<48}}{{at - before:8.3f}} s")
"""


def first_byte(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(seconds to the first byte on stdout, seconds to the exit); a failed command raises, naming it."""
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: a long log on stderr cannot block the child
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err)
        process.stdout.read(1)
        first = time.perf_counter() - start
        process.communicate()
        total = time.perf_counter() - start
        err.seek(0)
        log = err.read()
    if process.returncode != 0:
        tail = (log.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{' '.join(command[:4])} failed: {tail}")
    return first, total


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def engines(args, trees: dict[str, Path], model_file: str, binary: Path | None) -> dict[str, tuple]:
    """label -> (command, cwd, env): what each round starts."""
    python = sys.executable
    out = {"python -c 'import torch'": ([python, "-c", "import torch; print('x')"], ROOT, dict(os.environ))}
    for label, tree in trees.items():
        env = {**os.environ, "PYTHONPATH": str(tree / "src")}
        out[f"nexttok run ({label})"] = ([python, "-m", "nexttok", "run", args.model, args.prompt,
                                          "--max-tokens", "1", "--no-server"], tree, env)
    if binary is not None and (binary / "llama-cli").is_file() and model_file.endswith(".gguf"):
        out["llama-cli -n 1 (to its exit)"] = ([str(binary / "llama-cli"), "-m", model_file, "-p", args.prompt,
                                                "-n", "1", "-st", "--simple-io", "-t", str(args.threads)],
                                               ROOT, dict(os.environ))
    return out


def rounds(jobs: dict[str, tuple], count: int) -> dict[str, list[tuple[float, float]]]:
    times: dict[str, list[tuple[float, float]]] = {label: [] for label in jobs}
    labels = list(jobs)
    for command, cwd, env in jobs.values():  # warm-up: the page cache, and a tree's first kernels build
        first_byte(command, env, cwd)
    for r in range(count):
        for label in labels if r % 2 == 0 else labels[::-1]:
            command, cwd, env = jobs[label]
            times[label].append(first_byte(command, env, cwd))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a GGUF file or model name (default: the embedded model)")
    parser.add_argument("--prompt", default="Hi")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--against", metavar="REF", default=None, help="also time this commit of the repository")
    parser.add_argument("--llama-cpp-bin", default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from nexttok.bench_native import llama_cpp_bin
    from nexttok.checkpoints.bundled import DEFAULT_MODEL
    from nexttok.checkpoints.sources import resolve_checkpoint

    args.model = args.model or DEFAULT_MODEL
    model_file = str(resolve_checkpoint(args.model))
    with tempfile.TemporaryDirectory(prefix="nexttok-startup-") as scratch:
        trees = {"this tree": ROOT}
        if args.against:
            worktree = Path(scratch) / "against"
            made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree),
                                   args.against], capture_output=True, text=True)
            if made.returncode != 0:
                sys.exit(f"--against {args.against}: {(made.stderr.strip().splitlines() or ['git failed'])[-1]}")
            trees[args.against] = worktree
        try:
            times = rounds(engines(args, trees, model_file, llama_cpp_bin(args.llama_cpp_bin)), args.rounds)
        finally:
            if args.against:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees[args.against])],
                               capture_output=True)
    print(f"start-up on {model_file}, {args.rounds} rounds alternating; medians (range)")
    print(f"{'command':<36}{'first byte on stdout':>26}{'exit':>26}")
    for label, pairs in times.items():
        print(f"{label:<36}{spread([p[0] for p in pairs]):>26}{spread([p[1] for p in pairs]):>26}")
    print("\nwhere nexttok's start goes (this tree, one process):")
    phases = PHASES.format(model=args.model, prompt=args.prompt)
    subprocess.run([sys.executable, "-c", phases], env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, check=True)


if __name__ == "__main__":
    main()
