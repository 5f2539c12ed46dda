"""nexttok against llama.cpp's own `llama-bench` on the same GGUF file, in alternating rounds.

llama-bench is llama.cpp's C++ benchmark (built by ../shared/tools/build-llama-cpp.sh, or any build
named by --llama-cpp-bin or $NEXTTOK_LLAMA_CPP_BIN): `tg N` decodes N tokens one at a time, `pp N`
prefills an N-token prompt. nexttok's side is what `nexttok run` does: decode through generate()
(the sampler, stop rules and detokenizing included), greedy and with llama.cpp's default sampling
(top-k 40, top-p 0.95, min-p 0.05, temperature 0.8: what llama-cli and llama-server sample with
unless told otherwise; both rows are set against the same tg, which samples nothing), and the
prompt's prefill as run and the server chunk it. The model stays loaded in one child process;
each round runs both engines, the first of them alternating, so a host whose speed swings shows as
a range of ratios rather than as a wrong one. Every figure is a median over the rounds with its
range.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REFERENCE_BUILDS = Path.home() / ".cache" / "nexttok-ref" / "llama.cpp"  # where build-llama-cpp.sh puts them
METRICS = ("decode_tps", "sampled_tps", "prefill_tps")


def llama_cpp_bin(given: str | None = None) -> Path | None:
    """The folder holding llama-bench: --llama-cpp-bin, else $NEXTTOK_LLAMA_CPP_BIN, else the shared
    build script's cache; None where there is none. A folder named but without it is an error."""
    named = given or os.environ.get("NEXTTOK_LLAMA_CPP_BIN")
    if named:
        if not (Path(named) / "llama-bench").is_file():
            raise ValueError(f"no llama-bench in {named} (build it with ../shared/tools/build-llama-cpp.sh)")
        return Path(named)
    builds = sorted(REFERENCE_BUILDS.glob("build-*/bin/llama-bench"))
    return builds[0].parent if builds else None


@dataclass
class Rounds:
    """One metric's values per round for both engines: nexttok's, llama.cpp's, the ratios."""

    ours: list[float]
    theirs: list[float]

    @property
    def ratios(self) -> list[float]:
        return [a / b for a, b in zip(self.ours, self.theirs, strict=True)]

    def line(self, label: str) -> str:
        def spread(values: list[float], unit: str = "") -> str:
            return f"{statistics.median(values):.1f}{unit} ({min(values):.1f}-{max(values):.1f})"

        return f"{label:<22}{spread(self.ours):>22}{spread(self.theirs):>22}{self.ratio():>24}"

    def ratio(self) -> str:
        """The ratios' median (range): "1.53x (1.27-1.55)"."""
        r = self.ratios
        return f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})"


def llama_bench(binary: Path, model: str, threads: int, prompt: int, new: int) -> dict[str, float]:
    """One llama-bench run: {"decode_tps": tg, "prefill_tps": pp}, tokens/s."""
    out = subprocess.run([str(binary / "llama-bench"), "-m", model, "-t", str(threads), "-p", str(prompt), "-n",
                          str(new), "-r", "1", "-o", "json"], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed: {(out.stderr.strip().splitlines() or ['no output'])[-1]}")
    results = json.loads(out.stdout)
    by = {("prefill_tps" if r["n_prompt"] else "decode_tps"): float(r["avg_ts"]) for r in results}
    return by


def _worker(source: str, threads: int, prompt: int, new: int, conn, bandwidth: bool = False) -> None:
    """The model loaded once; each message "round" answers {"decode_tps", "sampled_tps", "prefill_tps"}
    (and, if asked, "read_gbs", the memory's read bandwidth measured right before and right after the
    greedy decode, the larger of the two (this host's memory swings between two states, ~35 and ~65 GB/s
    with 2 threads, within seconds: one measurement after the decode could catch the other state and
    put the decode above 100% of it), and
    "weight_bytes", what a decode step of the loaded model reads)."""
    import torch

    from nexttok.benchmark import decode_rate, measure_read_bandwidth, prefill_prompt, random_prompt, weight_bytes
    from nexttok.checkpoints.loading import load_checkpoint
    from nexttok.generation.parameters import LLAMA_CPP_SAMPLING
    from nexttok.generation.sampling import SamplingParams

    torch.set_num_threads(threads)
    checkpoint = load_checkpoint(source)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    start_ids = random_prompt(1, model.config.vocab_size)[0].tolist()  # llama-bench's tg starts from one token too
    long = random_prompt(prompt, model.config.vocab_size, seed=1)[0].tolist()

    def decode(n: int, params: SamplingParams) -> float:
        return decode_rate(model, tokenizer, start_ids, n, params)[0]

    decode(8, SamplingParams(temperature=0))  # warm-up
    prefill_prompt(model, long)
    conn.send("ready")
    seed = 0
    while conn.recv() == "round":
        start = time.perf_counter()
        prefill_prompt(model, long)
        prefill_tps = prompt / (time.perf_counter() - start)
        seed += 1
        before = measure_read_bandwidth() if bandwidth else 0.0
        got = {"prefill_tps": prefill_tps, "decode_tps": decode(new, SamplingParams(temperature=0))}
        if bandwidth:
            after = measure_read_bandwidth()
            got["read_gbs"], got["weight_bytes"] = max(before, after), weight_bytes(model)
            got["read_steady"] = max(before, after) < 1.2 * min(before, after)  # no flip around the decode seen
        conn.send({**got, "sampled_tps": decode(new, SamplingParams(**LLAMA_CPP_SAMPLING, seed=seed))})


def measure(model: str, binary: Path, *, threads: int = 2, prompt: int = 512, new: int = 128,
            rounds: int = 5, memory: list[tuple[float, int]] | None = None) -> dict[str, Rounds]:
    """nexttok and llama-bench on `model` (a .gguf), `rounds` alternating rounds: metric -> Rounds.
    A list given as memory gets, each round, (the read bandwidth in GB/s measured around nexttok's
    decode, the bytes a decode step reads, whether the bandwidths before and after it agreed within
    20%): the roofline of that round."""
    if not model.endswith(".gguf"):
        raise ValueError(f"llama-bench runs a .gguf file; {model} is not one")
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_worker, args=(model, threads, prompt, new, child, memory is not None),
                              daemon=True)
    process.start()
    try:
        if not parent.poll(600) or parent.recv() != "ready":
            raise RuntimeError("nexttok's process did not load the model")
        llama_bench(binary, model, threads, prompt, 8)  # warm-up: the file into the page cache
        ours: dict[str, list[float]] = {key: [] for key in METRICS}
        theirs: dict[str, list[float]] = {key: [] for key in METRICS}
        for r in range(rounds):
            for engine in (("nexttok", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "nexttok")):
                if engine == "nexttok":
                    parent.send("round")
                    got = parent.recv()
                    if memory is not None:
                        memory.append((got["read_gbs"], got["weight_bytes"], got["read_steady"]))
                else:
                    tg_pp = llama_bench(binary, model, threads, prompt, new)
                    got = {**tg_pp, "sampled_tps": tg_pp["decode_tps"]}
                for key in ours:
                    (ours if engine == "nexttok" else theirs)[key].append(got[key])
        parent.send("stop")
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
    return {key: Rounds(ours[key], theirs[key]) for key in METRICS}


def table(measured: dict[str, Rounds], title: str, prompt: int = 512, new: int = 128) -> str:
    """measure's result as compare prints it, under `title`."""
    header = f"{'metric (tokens/s)':<22}{'nexttok':>22}{'llama-bench':>22}{'nexttok/llama.cpp':>24}"
    return "\n".join([
        title, header,
        measured["decode_tps"].line(f"decode tg{new} greedy"),
        measured["sampled_tps"].line(f"decode tg{new} sampled"),
        measured["prefill_tps"].line(f"prefill pp{prompt}"),
        "sampled: nexttok with llama.cpp's default sampling (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8) "
        "against the same tg, which samples nothing",
    ])


def compare(model: str, binary: Path, *, threads: int = 2, prompt: int = 512, new: int = 128, rounds: int = 5) -> str:
    """nexttok and llama-bench on `model` (a .gguf), `rounds` alternating rounds: a text table."""
    measured = measure(model, binary, threads=threads, prompt=prompt, new=new, rounds=rounds)
    return table(measured, f"nexttok vs llama.cpp's llama-bench ({binary}) on {model}, {threads} threads, {rounds} "
                 "rounds alternating which runs first; medians (range)", prompt, new)
