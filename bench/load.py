"""Load test: N concurrent streaming clients against a nexttok server on loopback.

    python bench/load.py                         # starts a server on the default model in-process
    python bench/load.py --model DIR --clients 8 --requests 4
    python bench/load.py --url http://127.0.0.1:8000 --clients 64 --duration 60

Every request is greedy with a known prompt, so each stream's text must equal the text the same
request gives alone: a stream that differs is "garbled", one that ends without finish_reason and
[DONE] is "truncated". Reports aggregate tokens/s against one client, latency percentiles, TTFT,
errors. Bounded in requests and in time; loopback addresses only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "In 1905, Einstein",
           "The best way to learn", "Here is a list of fruits:", "Dear diary, today", "The weather tomorrow"]


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: list[str] = field(default_factory=list)
    garbled: int = 0
    truncated: int = 0


async def one_stream(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
                     expected: str | None, tally: Tally) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    text, first, finish, done, usage = "", None, None, False, None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                tally.errors.append(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    tally.errors.append(chunk["error"]["message"])
                    return
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk["choices"]:
                    first = first or time.perf_counter()
                    text += choice["text"]
                    finish = choice["finish_reason"] or finish
    except httpx.HTTPError as e:
        tally.errors.append(f"{type(e).__name__}: {e}")
        return
    tally.latencies.append(time.perf_counter() - start)
    if first:
        tally.ttfts.append(first - start)
    if not (done and finish and usage):
        tally.truncated += 1
    elif expected is not None and text != expected:
        tally.garbled += 1
    tally.tokens += usage["completion_tokens"] if usage else 0


async def run_clients(url: str, model: str, clients: int, requests: int, duration: float, max_tokens: int,
                      expected: dict[str, str]) -> tuple[Tally, float]:
    tally = Tally()
    deadline = time.perf_counter() + duration
    limits = httpx.Limits(max_connections=clients + 4)

    async def client_loop(n: int, client: httpx.AsyncClient) -> None:
        for i in range(requests):
            if time.perf_counter() > deadline:
                return
            prompt = PROMPTS[(n + i) % len(PROMPTS)]
            await one_stream(client, url, model, prompt, max_tokens, expected.get(prompt), tally)

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=duration + 120, limits=limits) as client:
        await asyncio.gather(*(client_loop(n, client) for n in range(clients)))
    return tally, time.perf_counter() - start


def expected_texts(url: str, model: str, max_tokens: int) -> dict[str, str]:
    """Each prompt's greedy completion, asked alone: what every stream must reproduce."""
    out = {}
    for prompt in PROMPTS:
        response = httpx.post(url + "/v1/completions", json={"model": model, "prompt": prompt,
                                                             "max_tokens": max_tokens, "temperature": 0},
                              timeout=300)
        response.raise_for_status()
        out[prompt] = response.json()["choices"][0]["text"]
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def describe(name: str, tally: Tally, seconds: float) -> str:
    rate = tally.tokens / seconds
    return (f"{name:<12} requests {len(tally.latencies):>4}  tokens {tally.tokens:>6}  {rate:>7.1f} tok/s"
            f"  latency p50 {percentile(tally.latencies, 50):6.2f}s p99 {percentile(tally.latencies, 99):6.2f}s"
            f"  TTFT p50 {percentile(tally.ttfts, 50):5.2f}s  errors {len(tally.errors)}"
            f"  garbled {tally.garbled}  truncated {tally.truncated}")


def start_server(model: str, max_running: int):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from live_server import LiveServer
    from nexttok.server import ServerLimits, create_app, load_served

    served = load_served(model)
    app = create_app([served], limits=ServerLimits(max_running=max_running, max_queue=1024))
    return LiveServer(app).__enter__(), served.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server on loopback (default: start one here)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2, help="per client")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds at most")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-running", type=int, default=8, help="batch slots of the in-process server")
    args = parser.parse_args()
    live = None
    if args.url:
        host = urlparse(args.url).hostname or ""
        if not (host.startswith("127.") or host in ("localhost", "::1")):
            parser.error("--url must be a loopback address")
        url, model = args.url.rstrip("/"), args.model
    else:
        live, model = start_server(args.model, args.max_running)
        url = live.url
    try:
        expected = expected_texts(url, model, args.max_tokens)
        single, single_s = asyncio.run(run_clients(url, model, 1, min(args.requests, 2) * 2, args.duration,
                                                   args.max_tokens, expected))
        many, many_s = asyncio.run(run_clients(url, model, args.clients, args.requests, args.duration,
                                               args.max_tokens, expected))
    finally:
        if live is not None:
            live.stop()
    print(describe("1 client", single, single_s))
    print(describe(f"{args.clients} clients", many, many_s))
    ratio = (many.tokens / many_s) / (single.tokens / single_s) if single.tokens else float("nan")
    print(f"aggregate throughput {ratio:.2f}x one client")
    for error in many.errors[:5]:
        print("error:", error)


if __name__ == "__main__":
    main()
