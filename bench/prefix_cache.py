"""Time to first token of turn 6 of a chat, with and without the prefix cache.

    python bench/prefix_cache.py                       # the default model, 5 trials
    python bench/prefix_cache.py --model NAME --trials 7 --max-tokens 96
    python bench/prefix_cache.py --chunk-cost          # what cutting every prefill into blocks costs

Two `nexttok serve` processes load the same model, one with --prefix-cache-tokens 0 and one with
the default. Each trial is a new greedy 6-turn chat through the official openai client. The chat
has a system prompt of its own, so no trial reuses another's blocks. Both servers run it, one after
the other, and the order alternates between trials because the machine is shared and noisy.

Turn 6's time to first token is measured at the client: the server sends the first chunk of a
stream once the first token has been sampled. The script prints medians and ranges, turn 6's prompt
length, the tokens it reused (from /metrics), and whether both servers gave the same answers
(they must).

--chunk-cost measures in-process what the fixed cut costs, with the cache on or off, for several
block sizes: prefill time in one forward call vs cut into blocks, on random prompts, interleaved.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time

import httpx
import openai

TOPICS = ["the printing press", "lighthouses", "honey bees", "the water cycle", "chess openings", "volcanoes",
          "sourdough bread", "the night sky", "paper maps", "bicycles", "tides", "glass making"]
QUESTIONS = ["Where should a beginner start?", "Tell me more about that.", "Why does it matter?",
             "What do people often get wrong?", "What came next?", "Sum it all up in two sentences."]


def start_server(model: str, prefix_cache_tokens: int | None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    option = [] if prefix_cache_tokens is None else ["--prefix-cache-tokens", str(prefix_cache_tokens)]
    process = subprocess.Popen([sys.executable, "-m", "nexttok", "serve", model, "--port", str(port),
                                "--log-level", "warning", *option])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server ({' '.join(option) or 'default'}) exited with {process.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.5)
    raise RuntimeError("the server did not start within 10 minutes")


def reused_tokens(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("nexttok_prefix_cache_reused_tokens_total "):
            return float(line.split()[1])
    return 0.0


def turn(client: openai.OpenAI, model: str, messages: list, max_tokens: int) -> tuple[str, float, int]:
    """Stream one greedy answer: (text, seconds to the first chunk, prompt tokens)."""
    start = time.perf_counter()
    first, parts, prompt_tokens = None, [], 0
    for chunk in client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens,
                                                stream=True, stream_options={"include_usage": True}):
        first = first or time.perf_counter() - start
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
    return "".join(parts), first, prompt_tokens


def chat(url: str, trial: int, max_tokens: int) -> dict:
    """One 6-turn chat: turn 6's time to first token, its prompt length, the tokens it reused, every answer."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=1200)
    model = client.models.list().data[0].id
    topic = TOPICS[trial % len(TOPICS)]
    messages = [{"role": "system", "content": f"Trial {trial}. You are a friendly expert on {topic}. Answer in "
                 "plain words, with one concrete example in every answer."}]
    answers = []
    for i, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question + (f" (about {topic})" if i == 0 else "")})
        before = reused_tokens(url)
        text, ttft, prompt_tokens = turn(client, model, messages, max_tokens)
        messages.append({"role": "assistant", "content": text})
        answers.append(text)
    return {"ttft": ttft, "prompt_tokens": prompt_tokens, "reused": reused_tokens(url) - before, "answers": answers}


def summary(values: list[float], unit: str = "s") -> str:
    return (f"median {statistics.median(values):.3f} {unit} (range {min(values):.3f}-{max(values):.3f} {unit}, "
            f"n={len(values)})")


def chunk_cost(model_name: str, repeats: int) -> None:
    """Prefill times in-process, the ways interleaved: a 1,024-token prompt in one call and cut at
    multiples of 64, 128 and 256; and a turn-6-sized prompt (620 tokens, the turn before 500) cut
    at each block size, whole (cache off) and after the blocks of the turn before (cache on)."""
    import torch

    from nexttok.checkpoints.loading import load_checkpoint
    from nexttok.generation.prefill import prefill_chunks
    from nexttok.models.slot_cache import SlotCache

    model = load_checkpoint(model_name).model
    cache = SlotCache.for_model(model.config, slots=1, max_len=1025, dtype=next(model.parameters()).dtype)
    ids = torch.randint(0, model.config.vocab_size, (1024,), generator=torch.Generator().manual_seed(0)).tolist()

    def timed(n: int, block: int, reused: int = 0) -> float:
        """Seconds to prefill ids[reused:n] cut at multiples of block, after ids[:reused] (untimed)."""
        slot = cache.claim()
        with torch.inference_mode():
            for a, b in prefill_chunks(0, reused, block) if reused else []:
                model(torch.tensor([ids[a:b]]), cache.row(slot), last_only=True)
            start = time.perf_counter()
            for a, b in prefill_chunks(reused, n, block):
                model(torch.tensor([ids[a:b]]), cache.row(slot), last_only=True)
            elapsed = time.perf_counter() - start
        cache.release(slot)
        return elapsed

    ways = {"1024 tokens, one call": (1024, 1024, 0)}
    for block in (64, 128, 256):
        ways[f"1024 tokens, cut at {block}"] = (1024, block, 0)
    ways["turn 6 (620 tokens), one call, no cache"] = (620, 1024, 0)
    for block in (64, 128, 256):
        ways[f"turn 6, cut at {block}, no cache"] = (620, block, 0)
        ways[f"turn 6, cut at {block}, {500 // block * block} reused"] = (620, block, 500 // block * block)
    times: dict[str, list[float]] = {name: [] for name in ways}
    timed(1024, 1024)  # warm-up
    names = list(ways)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:  # a different order each round
            times[name].append(timed(*ways[name]))
    for name, values in times.items():
        print(f"{name:>36}: {summary(values)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per answer (turns 1-6)")
    parser.add_argument("--chunk-cost", action="store_true", help="measure the fixed cut instead (in-process)")
    args = parser.parse_args()
    if args.chunk_cost:
        return chunk_cost(args.model, repeats=2 * args.trials)
    servers = {"without": start_server(args.model, 0), "with": start_server(args.model, None)}
    results: dict[str, list[dict]] = {"without": [], "with": []}
    try:
        for trial in range(args.trials):
            order = ["without", "with"] if trial % 2 == 0 else ["with", "without"]
            for name in order:
                results[name].append(chat(servers[name][1], trial, args.max_tokens))
                r = results[name][-1]
                print(f"trial {trial} {name:>7} prefix cache: turn 6 TTFT {r['ttft']:.3f} s, prompt "
                      f"{r['prompt_tokens']} tokens, {r['reused']:.0f} reused", flush=True)
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(timeout=60)
    same = all(a["answers"] == b["answers"] for a, b in zip(results["without"], results["with"], strict=True))
    prompts = [r["prompt_tokens"] for r in results["with"]]
    reused = [r["reused"] for r in results["with"]]
    print(f"\nmodel {args.model}; turn 6 prompt {min(prompts)}-{max(prompts)} tokens, "
          f"{min(reused):.0f}-{max(reused):.0f} of them reused with the cache")
    for name in ("without", "with"):
        print(f"turn 6 time to first token, {name:>7} prefix cache: {summary([r['ttft'] for r in results[name]])}")
    ratios = [b["ttft"] / a["ttft"] for a, b in zip(results["with"], results["without"], strict=True)]
    print(f"speed-up per trial (without / with): {summary(ratios, 'x')}")
    print(f"answers identical with and without the prefix cache: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
