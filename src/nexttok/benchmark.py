"""Side-by-side speed measurements: nexttok, HF transformers and llama.cpp on the same weights.

Each engine runs in its own child process (so peak RSS is its own) on the same checkpoint (a
directory or a .gguf file), with the same thread count; the table shows medians over repeats and
the ratios. llama.cpp runs a .gguf as it is (the very file nexttok runs), or a float32 GGUF our
exporter writes from a GPT-2 directory. HF loads a .gguf dequantized to float32.
The roofline is the time one decode step needs just to read every weight once from memory (the
bytes nexttok's model really holds, quantized or not ÷ read bandwidth measured here), as tokens/s.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import resource
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty

import torch

from nexttok.checkpoints.export import write_gguf
from nexttok.checkpoints.gguf.reader import GGUFError
from nexttok.checkpoints.loading import load_checkpoint
from nexttok.generation import prefill as prefill_module
from nexttok.generation.loop import context_window, generate
from nexttok.generation.parameters import LLAMA_CPP_SAMPLING
from nexttok.generation.prefill import prefill
from nexttok.generation.sampling import SamplingParams
from nexttok.generation.speculative import NgramDrafter, Rounds, speculative_stream
from nexttok.models import kernels
from nexttok.models.cache import KVCache
from nexttok.models.kernels.slabs import huge_pages

METRICS = (  # key, label, higher is better
    ("decode_tps", "decode tokens/s (batch 1, greedy)", True),
    ("sampled_tps", "decode tokens/s, sampled (T 0.8, top-k 40)", True),
    ("prefill_tps", "prefill tokens/s", True),
    ("ttft_ms", "time to first token, ms", False),
    ("nocache_tps", "decode tokens/s without KV cache", True),
    ("peak_rss_mb", "peak RSS, MB", False),
    ("compile_s", "decode step compile (first use), s", False),
)
# Steps as `nexttok run` makes them without --trace or --json: no logprobs, rank or alternatives
LEAN = {"top_n": 0, "logprobs": False}
OURS = ("nexttok", "compiled")  # columns of this engine: as loaded, and with the decode step compiled


@dataclass
class BenchConfig:
    source: str  # a checkpoint directory or a .gguf file
    new_tokens: int = 128
    prompt_tokens: int = 512
    decode_prompt_tokens: int = 16
    nocache_tokens: int = 16
    context_tokens: int = 16384  # the context the cache's bytes are reported at (the model's own, if shorter)
    repeat: int = 3
    threads: int = 2
    dtype: str = "auto"  # nexttok's: a .gguf as shipped, a directory in float32 (HF: float32 then)
    compile: bool = False  # nexttok's decode step through torch.compile
    tensor_parallel: int = 1  # nexttok's model split over this many local processes (parallel.py)
    extra: dict = field(default_factory=dict)


def measure_read_bandwidth(megabytes: int = 512, repeat: int = 5) -> float:
    """Memory read bandwidth in GB/s: the best time to sum a buffer much larger than the caches, on
    2 MiB pages as the kernels' weights are (huge_pages: on 4 KiB pages the same sum read
    27-30 GB/s where it read 33 here), so that the roofline is what the memory gives, not less."""
    data = torch.empty(megabytes * (1 << 20) // 4, dtype=torch.float32)
    huge_pages(data)
    data.fill_(1.0)
    data.sum()
    best = min(_timed(data.sum) for _ in range(repeat))
    return data.numel() * 4 / best / 1e9


def _timed(fn: Callable) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def random_prompt(n: int, vocab: int, seed: int = 0):
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def _median(values: list[float]) -> float:
    return statistics.median(values)


def bench_nexttok(cfg: BenchConfig) -> dict:
    torch.set_num_threads(cfg.threads)
    if cfg.tensor_parallel > 1:  # the ranks share the threads: cfg.threads // N each
        from nexttok.parallel.model import load_parallel

        checkpoint = load_parallel(cfg.source, world=cfg.tensor_parallel, dtype=cfg.dtype, device="cpu",
                                   compile=cfg.compile, threads=max(1, cfg.threads // cfg.tensor_parallel))
    else:
        checkpoint = load_checkpoint(cfg.source, dtype=cfg.dtype, device="cpu", compile=cfg.compile)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    vocab = model.config.vocab_size
    greedy = SamplingParams(temperature=0)

    def decode_run(prompt, n, use_cache=True, params=greedy):
        return decode_rate(model, tokenizer, prompt, n, params, use_cache)

    short = random_prompt(cfg.decode_prompt_tokens, vocab)[0].tolist()
    long = random_prompt(cfg.prompt_tokens, vocab, seed=1)[0].tolist()
    decode_run(short, 8)  # warm-up
    decode = [decode_run(short, cfg.new_tokens)[0] for _ in range(cfg.repeat)]
    sampled = [decode_run(short, cfg.new_tokens, params=SamplingParams(**LLAMA_CPP_SAMPLING, seed=k))[0]
               for k in range(cfg.repeat)]
    ttft = [generate(model, tokenizer, long, greedy, max_tokens=1, stop_token_ids=[], **LEAN).steps[0].elapsed
            for _ in range(cfg.repeat)]
    prefill = [cfg.prompt_tokens / _timed(lambda: prefill_prompt(model, long)) for _ in range(cfg.repeat)]
    nocache = [decode_run(long, cfg.nocache_tokens, use_cache=False)[0] for _ in range(max(1, cfg.repeat - 1))]
    cached_long = [decode_run(long, cfg.nocache_tokens)[0] for _ in range(max(1, cfg.repeat - 1))]
    spec = speculative_decode(model, tokenizer, cfg, decode_run) if cfg.tensor_parallel == 1 else {}
    compiled = {"compile_s": model.compiled.compile_seconds} if model.compiled else {}
    if cfg.tensor_parallel > 1:
        model.group.close()  # a spawned bench process runs no atexit: stop the other ranks here
    return {"decode_tps": _median(decode), "sampled_tps": _median(sampled), "prefill_tps": _median(prefill),
            "ttft_ms": 1000 * _median(ttft), "nocache_tps": _median(nocache), "cache_long_tps": _median(cached_long),
            "weight_bytes": weight_bytes(model), "cache_held": cache_held(model, cfg.context_tokens),
            **spec, **compiled}


def decode_rate(model, tokenizer, prompt: list[int], n: int, params: SamplingParams,
                use_cache: bool = True) -> tuple[float, float]:
    """(decode tokens/s from the first token on, the first token's seconds) of n tokens generated as
    `nexttok run` generates them (no logprobs or alternatives asked for, no stop tokens)."""
    start = time.perf_counter()
    steps = generate(model, tokenizer, prompt, params, max_tokens=n, stop_token_ids=[], use_cache=use_cache,
                     **LEAN).steps
    first = start + steps[0].elapsed
    return (len(steps) - 1) / (time.perf_counter() - first), steps[0].elapsed


def cache_held(model, context: int) -> dict[str, int]:
    """Bytes the cache generation uses holds at `context` tokens, by layer type (KVCache.held_bytes:
    full, sliding, recurrent), and "all_full": what keys for every layer would take. Laid out on the
    meta device (nothing allocated); the recurrent states, made on first use, by one token's pass."""
    config = model.config
    context = min(context, config.max_position_embeddings)
    windowed = KVCache.for_model(config, max_len=context, device="meta", windowed=True).held_bytes()
    if config.recurrent_layers:
        weights = next(model.parameters())
        states = KVCache.for_model(config, max_len=2, dtype=weights.dtype, device=weights.device)
        with torch.inference_mode():
            model(torch.zeros(1, 1, dtype=torch.long, device=weights.device), states)
        windowed["recurrent"] = states.state_bytes()
    every = KVCache(config.num_hidden_layers, 1, config.num_key_value_heads, context, config.head_dim,
                    device="meta").held_bytes()["full"]
    return {"context": context, **windowed, "all_full": every}


def speculative_decode(model, tokenizer, cfg: BenchConfig, decode_run) -> dict:
    """Greedy decode tokens/s on a prompt that repeats its context (a code-editing request over one
    of this package's modules): plain, and with prompt-lookup (ngram) drafts; and the acceptance."""
    code = Path(prefill_module.__file__).read_text(encoding="utf-8")[:2400]
    ids = tokenizer.encode(f"Here is a Python module:\n\n{code}\n\nThe same module, unchanged:\n\n{code[:160]}",
                           add_special=True)
    if len(ids) + cfg.new_tokens > context_window(model.config):
        return {}  # a model of a short context (GPT-2's tiny test models): no room for the request
    plain = [decode_run(ids, cfg.new_tokens)[0] for _ in range(cfg.repeat)]
    drafted, rounds = [], []
    for _ in range(cfg.repeat):
        counts = Rounds()
        start = time.perf_counter()
        steps = list(speculative_stream(model, tokenizer, ids, SamplingParams(temperature=0), NgramDrafter(),
                                        rounds=counts, max_tokens=cfg.new_tokens, stop_token_ids=[], **LEAN))
        first = start + steps[0].elapsed
        drafted.append((len(steps) - 1) / (time.perf_counter() - first))
        rounds.append(counts)
    return {"spec_plain_tps": _median(plain), "spec_tps": _median(drafted),
            "spec_acceptance": _median([r.acceptance for r in rounds]),
            "spec_per_forward": _median([r.tokens_per_forward for r in rounds])}


def bench_compiled(cfg: BenchConfig) -> dict:
    """nexttok with the decode step compiled; its first decode (the warm-up) pays the compile."""
    return bench_nexttok(dataclasses.replace(cfg, compile=True))


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step reads: every parameter once (a tied one once) and the quantized layers'
    packed weights and scales; not the RoPE tables, of which a step reads one row."""
    buffers = sum(b.numel() * b.element_size() for name, b in model.named_buffers() if "rope" not in name)
    return buffers + sum(p.numel() * p.element_size() for p in model.parameters())


def prefill_prompt(model, ids: list[int]) -> None:
    """The prompt into a fresh cache as `nexttok run` and the server prefill it (in BLOCK chunks)."""
    cache = KVCache.for_model(model.config, max_len=len(ids) + 1, dtype=next(model.parameters()).dtype)
    with torch.inference_mode():
        prefill(model, cache, ids)


def bench_hf(cfg: BenchConfig) -> dict:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(cfg.threads)
    dtype = torch.float32 if cfg.dtype in ("auto", "int8", "int4") else getattr(torch, cfg.dtype)
    path = Path(cfg.source)
    where = dict(gguf_file=path.name) if path.suffix == ".gguf" else {}
    model = AutoModelForCausalLM.from_pretrained(path.parent if where else path, dtype=dtype, **where).eval()
    vocab = model.config.vocab_size
    short, long = random_prompt(cfg.decode_prompt_tokens, vocab), random_prompt(cfg.prompt_tokens, vocab, seed=1)

    def hf_generate(ids, n):
        with torch.inference_mode():
            return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)

    hf_generate(short, 8)  # warm-up
    decode = []
    for _ in range(cfg.repeat):
        first = _timed(lambda: hf_generate(short, 1))
        total = _timed(lambda: hf_generate(short, cfg.new_tokens))
        decode.append((cfg.new_tokens - 1) / (total - first))
    ttft = [_timed(lambda: hf_generate(long, 1)) for _ in range(cfg.repeat)]
    with torch.inference_mode():
        prefill = [cfg.prompt_tokens / _timed(lambda: model(long, use_cache=True, logits_to_keep=1))
                   for _ in range(cfg.repeat)]
    return {"decode_tps": _median(decode), "prefill_tps": _median(prefill), "ttft_ms": 1000 * _median(ttft)}


def bench_llama_cpp(cfg: BenchConfig) -> dict:
    """llama.cpp (llama-cpp-python) on the same GGUF file (or a float32 GGUF of a GPT-2 directory)."""
    from llama_cpp import Llama

    n_ctx = cfg.prompt_tokens + cfg.new_tokens + 16
    llm = Llama(model_path=cfg.extra["gguf"], n_ctx=n_ctx, n_batch=cfg.prompt_tokens, n_threads=cfg.threads,
                n_threads_batch=cfg.threads, verbose=False)
    vocab = llm.n_vocab()
    short = random_prompt(cfg.decode_prompt_tokens, vocab)[0].tolist()
    long = random_prompt(cfg.prompt_tokens, vocab, seed=1)[0].tolist()

    def llama_generate(ids, n, sampling=None) -> tuple[float, float]:
        """(time to first token, decode tokens/s) for n tokens, greedy unless sampling is given."""
        llm.reset()
        start = time.perf_counter()
        first = None
        settings = {"temp": 0.0, "top_k": 1} if sampling is None else {
            "temp": sampling["temperature"], **{k: sampling[k] for k in ("top_k", "top_p", "min_p")}}
        for count, _ in enumerate(llm.generate(ids, reset=True, **settings), start=1):
            first = first or time.perf_counter()
            if count == n:
                break
        return first - start, (n - 1) / (time.perf_counter() - first) if n > 1 else 0.0

    llama_generate(short, 8)  # warm-up
    decode = [llama_generate(short, cfg.new_tokens)[1] for _ in range(cfg.repeat)]
    sampled = [llama_generate(short, cfg.new_tokens, LLAMA_CPP_SAMPLING)[1] for _ in range(cfg.repeat)]
    ttft = [llama_generate(long, 1)[0] for _ in range(cfg.repeat)]

    def prefill() -> float:
        llm.reset()
        return _timed(lambda: llm.eval(long))

    prefills = [cfg.prompt_tokens / prefill() for _ in range(cfg.repeat)]
    return {"decode_tps": _median(decode), "sampled_tps": _median(sampled), "prefill_tps": _median(prefills),
            "ttft_ms": 1000 * _median(ttft)}


def _child(target, cfg, queue) -> None:
    try:
        result = target(cfg)
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        queue.put(("ok", result))
    except Exception as e:  # reported as a skipped column, not a crash of the whole run
        queue.put(("error", f"{type(e).__name__}: {e}"))


def run_isolated(target: Callable[[BenchConfig], dict], cfg: BenchConfig) -> dict | str:
    """target(cfg) in a fresh process; its dict plus peak_rss_mb, or an error string, also when
    the child dies without a word (a native crash, the kernel's OOM killer): the parent polls
    rather than waiting on the queue for ever."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(target, cfg, queue))
    process.start()
    while True:
        try:
            status, payload = queue.get(timeout=0.5)
            break
        except Empty:
            if not process.is_alive():
                try:  # it may have put its answer just before exiting
                    status, payload = queue.get(timeout=0.5)
                    break
                except Empty:
                    return f"the engine's process died ({_exit_reason(process.exitcode)}) before reporting"
    process.join()
    return payload if status == "ok" else str(payload)


def _exit_reason(code: int | None) -> str:
    """exit code 1, or signal SIGSEGV (a negative exitcode is the signal that ended it)."""
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def report(results: dict[str, dict | str], bandwidth_gbs: float, cfg: BenchConfig) -> str:
    """A plain-text table of medians, ratios against nexttok, and the roofline."""
    names = list(results)
    ok = {n: r for n, r in results.items() if isinstance(r, dict)}
    pairs = [(a, b) for a in OURS if a in ok for b in names if b not in OURS and b in ok]
    lines = [f"{'metric':<42}" + "".join(f"{n:>16}" for n in names) + "".join(f"{a + '/' + b:>20}" for a, b in pairs)]
    for key, label, higher in METRICS:
        if not any(key in r for r in ok.values()):
            continue
        row = f"{label:<42}"
        for n in names:
            value = ok.get(n, {}).get(key)
            row += f"{value:>16.1f}" if value is not None else f"{'-':>16}"
        for a, b in pairs:
            ours, theirs = ok[a].get(key), ok[b].get(key)
            ratio = (ours / theirs if higher else theirs / ours) if ours and theirs else None
            row += f"{ratio:>19.2f}x" if ratio else f"{'-':>20}"
        lines.append(row)
    for n, r in results.items():
        if isinstance(r, str):
            lines.append(f"{n}: skipped ({r})")
    lines.append(f"block kernels dispatched to: {kernels.describe()}")
    ours = ok.get("nexttok")
    if ours:
        roofline = bandwidth_gbs * 1e9 / ours["weight_bytes"]
        lines += [
            f"memory read bandwidth {bandwidth_gbs:.1f} GB/s; weights {ours['weight_bytes'] / 1e6:.0f} MB "
            f"-> roofline {roofline:.1f} tokens/s; nexttok decode at {100 * ours['decode_tps'] / roofline:.0f}% of it"
            + (f" (compiled: {100 * ok['compiled']['decode_tps'] / roofline:.0f}%)" if "compiled" in ok else ""),
            f"KV cache vs none after a {cfg.prompt_tokens}-token prompt: {ours['cache_long_tps']:.1f} vs "
            f"{ours['nocache_tps']:.1f} tokens/s = {ours['cache_long_tps'] / ours['nocache_tps']:.1f}x",
            held_line(ours["cache_held"]),
        ]
        if "spec_tps" in ours:
            lines.append(f"speculative decoding (ngram drafts) on a prompt that repeats its context: "
                         f"{ours['spec_tps']:.1f} vs {ours['spec_plain_tps']:.1f} tokens/s plain = "
                         f"{ours['spec_tps'] / ours['spec_plain_tps']:.2f}x; {100 * ours['spec_acceptance']:.0f}% "
                         f"of drafts accepted, {ours['spec_per_forward']:.2f} tokens per forward pass")
    return "\n".join(lines)


def held_line(held: dict[str, int]) -> str:
    """held_line({"context": 4096, "full": 2**20, "sliding": 0, "recurrent": 0, "all_full": 2**20}) ->
    'cache held at 4096 tokens: full layers 1.0 MiB (keys for every layer: 1.0 MiB)'"""
    parts = [f"{kind} layers {held[kind] / 2**20:.1f} MiB" for kind in ("full", "sliding") if held[kind]]
    if held["recurrent"]:
        parts.append(f"recurrent states {held['recurrent'] / 2**10:.1f} KiB")
    return (f"cache held at {held['context']} tokens: {', '.join(parts)} (keys for every layer: "
            f"{held['all_full'] / 2**20:.1f} MiB)")


def llama_cpp_column(cfg: BenchConfig, workdir: str) -> str | None:
    """Prepare the llama.cpp column (the .gguf itself, or a float32 GGUF of a checkpoint directory);
    None, or why it is skipped."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install llama-cpp-python builds llama.cpp from source)"
    if cfg.source.endswith(".gguf"):
        cfg.extra["gguf"] = cfg.source
        return None
    try:
        cfg.extra["gguf"] = str(write_gguf(cfg.source, f"{workdir}/model-f32.gguf"))
    except GGUFError as e:
        return str(e)
    return None


def run(cfg: BenchConfig, engines: list[str]) -> str:
    """Each engine in its own process; "llama.cpp" joins when llama-cpp-python is installed."""
    import tempfile

    targets = {"nexttok": bench_nexttok, "compiled": bench_compiled, "hf": bench_hf, "llama.cpp": bench_llama_cpp}
    unknown = [e for e in engines if e not in targets]
    if unknown:
        raise ValueError(f"unknown engines {unknown}; choose from {', '.join(targets)}")
    with tempfile.TemporaryDirectory() as workdir:
        results: dict[str, dict | str] = {}
        for name in engines:
            skipped = llama_cpp_column(cfg, workdir) if name == "llama.cpp" else None
            results[name] = skipped if skipped else run_isolated(targets[name], cfg)
        return report(results, measure_read_bandwidth(), cfg)
