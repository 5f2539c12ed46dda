"""Each sampler stage's cost per token, and (where llama.cpp is built) its own samplers on the same logits.

    .venv/bin/python bench/samplers.py [--vocab 49152] [--steps 300]
    .venv/bin/python bench/samplers.py --llama-lib ~/.cache/nexttok-ref/llama.cpp/build-avx2/bin

Every stage of nexttok.generation.stages.STAGES, switched on alone (ON below), samples a token from a
fresh row of random logits per step and accepts it (so a stateful stage pays its upkeep, DRY over a
context that grows); the table gives the median microseconds per token of the stage's apply (what
it costs) and of the whole step with the draw and accept (a stage that cuts makes the draw cheaper:
it sorts only what is left). Then greedy, llama.cpp's default chain, and every stage at once. DRY reads
the default model's tokenizer for its sequence breakers. The block kernels are loaded first (where they
build), as in any process that has run a GGUF model: the sampler then takes their short paths.

--llama-lib: a llama.cpp build (libllama.so and its ggml libraries). Its samplers run through ctypes
on the same logits and the tokens each keeps are compared with nexttok's stage: typical-p, top-n-sigma,
XTC (probability 1), dynamic temperature, DRY (token contexts, no breakers) and Mirostat 1 and 2 (the
first step's cut). The unit tests check the stages against llama.cpp's rules written out; this checks
them against its code.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path

import torch

from nexttok.generation.sampling import SamplerChain, SamplingParams
from nexttok.generation.stages import NEG_INF, STAGES
from nexttok.models import kernels

ON = {  # settings that switch each stage on, as people use them
    "penalties": {"repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.5},
    "dry": {"dry_multiplier": 0.8},
    "logit_bias": {"logit_bias": {1: 5.0, 2: -100.0}},
    "top_n_sigma": {"top_n_sigma": 1.0},
    "top_k": {"top_k": 40},
    "typical_p": {"typical_p": 0.9},
    "top_p": {"top_p": 0.95},
    "min_p": {"min_p": 0.05},
    "xtc": {"xtc_probability": 0.5, "xtc_threshold": 0.1},
    "temperature": {"temperature": 0.8},
    "mirostat": {"mirostat": 2},
}
EXTRA = {"greedy (temperature 0)": {"temperature": 0},
         "temperature (dynamic)": {"temperature": 0.8, "dynatemp_range": 0.5},
         "mirostat (v1)": {"mirostat": 1},
         "typical_p after top-k 40": {"top_k": 40, "typical_p": 0.9},
         "llama.cpp's default chain": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
         "every stage at once": {**{k: v for s in ON.values() for k, v in s.items()}, "mirostat": 0,
                                 "dynatemp_range": 0.5}}


def rows(vocab: int, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """Logits shaped roughly like a model's: a few clear favourites over a wide tail."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(vocab, generator=gen) * 2.5 for _ in range(steps)]


def per_token(settings: dict, logits: list[torch.Tensor], tokenizer, prompt: list[int]) -> tuple[float, float]:
    """Median microseconds per token: the stages' apply (onto the whole row), and a step as decode
    takes it (chain.sample: the stages, on top-k's kept values where they may, and the draw) + accept."""
    chain = SamplerChain.from_params(SamplingParams(**settings, seed=0), logits[0].shape[0], prompt,
                                     tokenizer=tokenizer)
    stages, steps = [], []
    for row in logits:
        start = time.perf_counter()
        chain.apply(row)
        applied = time.perf_counter()
        chain.accept(chain.sample(row).token_id)
        stages.append(applied - start)
        steps.append(time.perf_counter() - applied)
    return statistics.median(stages) * 1e6, statistics.median(steps) * 1e6


def cost_table(vocab: int, steps: int) -> None:
    from nexttok.checkpoints.bundled import DEFAULT_MODEL
    from nexttok.checkpoints.sources import load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    logits = rows(vocab, steps)
    prompt = torch.randint(0, min(vocab, tokenizer.vocab_size), (200,), generator=torch.Generator().manual_seed(1))
    prompt = prompt.tolist()
    print(f"sampler stages, vocabulary {vocab:,}, median of {steps} tokens\n")
    print(f"{'stage':<28}{'apply µs/token':>16}{'with the draw':>16}")
    for name, settings in [("(none: the draw alone)", {}), *((s.name, ON[s.name]) for s in STAGES), *EXTRA.items()]:
        applied, whole = per_token(settings, logits, tokenizer, prompt)
        print(f"{name:<28}{applied:>16.1f}{whole:>16.1f}")


# -- llama.cpp's own samplers -----------------------------------------------------------------------


class TokenData(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int32), ("logit", ctypes.c_float), ("p", ctypes.c_float)]


class TokenDataArray(ctypes.Structure):
    _fields_ = [("data", ctypes.POINTER(TokenData)), ("size", ctypes.c_size_t), ("selected", ctypes.c_int64),
                ("sorted", ctypes.c_bool)]


def load_llama(directory: Path) -> ctypes.CDLL:
    for name in ("libggml-base.so", "libggml-cpu.so", "libggml.so"):
        ctypes.CDLL(str(directory / name), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(directory / "libllama.so"))
    pointer, f, i32, u32, size = ctypes.c_void_p, ctypes.c_float, ctypes.c_int32, ctypes.c_uint32, ctypes.c_size_t
    signatures = {"llama_sampler_init_typical": [f, size], "llama_sampler_init_top_n_sigma": [f],
                  "llama_sampler_init_xtc": [f, f, size, u32], "llama_sampler_init_temp_ext": [f, f, f],
                  "llama_sampler_init_mirostat": [i32, u32, f, f, i32], "llama_sampler_init_mirostat_v2": [u32, f, f],
                  "llama_sampler_init_dry": [pointer, f, f, i32, i32, pointer, size]}
    for name, args in signatures.items():
        getattr(lib, name).argtypes, getattr(lib, name).restype = args, pointer
    lib.llama_sampler_apply.argtypes = [pointer, ctypes.POINTER(TokenDataArray)]
    lib.llama_sampler_accept.argtypes = [pointer, i32]
    lib.llama_sampler_free.argtypes = [pointer]
    return lib


def llama_apply(lib, sampler, logits: torch.Tensor, context: list[int] = ()) -> torch.Tensor:
    """llama.cpp's sampler on logits (after accepting context): logits of what it kept, -inf elsewhere
    (its values as it left them)."""
    for token in context:
        lib.llama_sampler_accept(sampler, token)
    data = (TokenData * logits.shape[0])(*[TokenData(i, float(x), 0.0) for i, x in enumerate(logits.tolist())])
    array = TokenDataArray(data, logits.shape[0], -1, False)
    lib.llama_sampler_apply(sampler, ctypes.byref(array))
    out = torch.full_like(logits, NEG_INF)
    for k in range(array.size):
        out[array.data[k].id] = array.data[k].logit
    lib.llama_sampler_free(sampler)
    return out


def compare_with_llama(directory: Path, vocab: int, trials: int) -> int:
    lib = load_llama(directory)
    failures = 0
    for trial in range(trials):
        logits = rows(vocab, 1, seed=100 + trial)[0]
        context = torch.randint(0, 8, (60,), generator=torch.Generator().manual_seed(trial)).tolist()
        small = logits[:8].clone()
        cases = [
            ("typical_p", {"typical_p": 0.9}, lib.llama_sampler_init_typical(0.9, 0), logits, []),
            ("top_n_sigma", {"top_n_sigma": 1.0}, lib.llama_sampler_init_top_n_sigma(1.0), logits, []),
            ("xtc", {"xtc_probability": 1.0, "xtc_threshold": 0.05}, lib.llama_sampler_init_xtc(1.0, 0.05, 0, 0),
             logits * 2, []),
            ("dynatemp", {"temperature": 0.8, "dynatemp_range": 0.5}, lib.llama_sampler_init_temp_ext(0.8, 0.5, 1.0),
             logits, []),
            ("mirostat 1", {"mirostat": 1}, lib.llama_sampler_init_mirostat(vocab, 0, 5.0, 0.1, 100), logits, []),
            ("mirostat 2", {"mirostat": 2}, lib.llama_sampler_init_mirostat_v2(0, 5.0, 0.1), logits, []),
            ("dry", {"dry_multiplier": 0.8, "dry_allowed_length": 1, "dry_sequence_breakers": []},
             lib.llama_sampler_init_dry(None, 0.8, 1.75, 1, 64, None, 0), small, context),
        ]
        for name, settings, sampler, row, seen in cases:
            theirs = llama_apply(lib, sampler, row, seen)
            chain = SamplerChain.from_params(SamplingParams(**settings, seed=0), row.shape[0], seen)
            ours = chain.apply(row)
            verdict = agreement(name, ours, theirs)
            failures += verdict == "DIFFERENT"
            print(f"{name:<12} trial {trial}: {verdict} "
                  f"({int((ours > NEG_INF).sum())} kept by nexttok, {int((theirs > NEG_INF).sum())} by llama.cpp)")
    return failures


def agreement(name: str, ours: torch.Tensor, theirs: torch.Tensor) -> str:
    """same; or, for typical-p, the same ranking cut a few tokens apart: llama.cpp keeps its running sum
    of thousands of probabilities in float32, nexttok equals a float64 sum (tests/llama_reference.py)."""
    a, b = ours > NEG_INF, theirs > NEG_INF
    if torch.equal(a, b):
        if name in ("dynatemp", "dry") and not torch.allclose(ours[a], theirs[b], rtol=1e-4, atol=1e-5):
            return "DIFFERENT"
        return "same"
    nested = bool((a & ~b).sum() == 0 or (b & ~a).sum() == 0)
    apart = int((a ^ b).sum())
    if name == "typical_p" and nested and apart <= max(2, int(a.sum()) // 1000):
        return f"same ranking, the cut {apart} tokens apart (float32 running sum)"
    return "DIFFERENT"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=49152, help="logits per row (default %(default)s)")
    parser.add_argument("--steps", type=int, default=300, help="tokens per stage (default %(default)s)")
    parser.add_argument("--llama-lib", type=Path, default=None, metavar="DIR",
                        help="a llama.cpp build with libllama.so: compare its samplers on the same logits")
    args = parser.parse_args()
    torch.set_num_threads(1)  # per-token sampling is small work: one thread, as a server's scheduler runs it
    kernels.load()  # as in any process that has run a GGUF model: top-k's C++ pass, the kept path, kernels.pick
    if args.llama_lib is not None:
        return 1 if compare_with_llama(args.llama_lib.expanduser(), args.vocab, trials=3) else 0
    cost_table(args.vocab, args.steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
