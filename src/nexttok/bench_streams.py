"""Throughput under load: `nexttok serve` against llama.cpp's `llama-server -np N` (continuous
batching) on the same GGUF file, N concurrent streaming requests at a time.

For each N, each round starts one server, warms it with one short request, fires N streaming
/v1/completions requests at once (the same prompt, temperature 0, stream true) from N threads, and
stops it; then the other engine. Only one server is ever alive (the host's cores are shared by
both), and which engine goes first alternates over the rounds, so a host whose speed swings shows as
a range rather than as a wrong ratio. Aggregate tokens/s = completion tokens of the round / its wall
time (first request sent to last one done); time to first token is per request, from sending it to
the first chunk carrying text. Tokens are counted as the server reports them (usage), else one per
chunk carrying text; a request may stop at EOS, so each engine's total per round is printed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from nexttok.bench_native import llama_cpp_bin

PROMPT = ("Once upon a time, on a rocky island far out at sea, there lived an old lighthouse keeper. "
          "Every night he")  # a story to continue: no early EOS, so both engines write max_tokens
WARM_UP = "The weather today is"
CTX_PER_STREAM = 1024  # llama-server's -c is shared by its -np slots: each gets this many
ENGINES = ("nexttok", "llama-server")


def parse_streams(text: str) -> list[int]:
    """--streams as a list of counts: parse_streams("1,4,8") == [1, 4, 8]."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--streams {text!r}: a comma-separated list of stream counts, e.g. 1,4,8") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"--streams {text!r}: each stream count must be >= 1")
    return counts


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, interpolated between ranks as numpy's default does:
    percentile([1, 2, 3, 4], 50) == 2.5; percentile([1, 2, 3, 4], 95) == 3.85."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def free_port() -> int:
    """A loopback port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def llama_server(given: str | None = None) -> tuple[Path | None, str]:
    """llama.cpp's llama-server (found as bench_native finds llama-bench), or None and why not."""
    try:
        folder = llama_cpp_bin(given)
    except ValueError as e:
        return None, str(e)
    if folder is None:
        return None, ("no llama.cpp build found (--llama-cpp-bin DIR, $NEXTTOK_LLAMA_CPP_BIN, or "
                      "../shared/tools/build-llama-cpp.sh)")
    binary = folder / "llama-server"
    return (binary, "") if binary.is_file() else (None, f"no llama-server in {folder}")


@dataclass
class Request:
    """One streamed request: seconds to its first text, completion tokens, seconds in all."""

    ttft: float
    tokens: int
    started: float
    ended: float


@dataclass
class Round:
    """N requests fired together at one server."""

    requests: list[Request]

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        wall = max(r.ended for r in self.requests) - min(r.started for r in self.requests)
        return self.tokens / wall


def stream_one(client, url: str, payload: dict) -> Request:
    """POST one streaming completion and read it to its end (SSE "data:" lines, then [DONE])."""
    started = time.perf_counter()
    ttft, chunks, usage = None, 0, None
    with client.stream("POST", url + "/v1/completions", json=payload) as response:
        if response.status_code != 200:
            body = response.read().decode(errors="replace").strip().splitlines() or [""]
            raise RuntimeError(f"{url}: HTTP {response.status_code} {body[0][:200]}")
        for line in response.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                raise RuntimeError(f"{url}: {chunk['error']}")
            usage = chunk.get("usage") or usage
            if any(choice.get("text") for choice in chunk.get("choices") or ()):
                chunks += 1
                ttft = time.perf_counter() - started if ttft is None else ttft
    ended = time.perf_counter()
    tokens = usage["completion_tokens"] if usage and "completion_tokens" in usage else chunks
    return Request(ttft if ttft is not None else ended - started, tokens, started, ended)


def fire(url: str, model: str, n: int, *, max_tokens: int, prompt: str = PROMPT) -> Round:
    """n streaming requests at once (n threads released together), each read to its end."""
    import httpx

    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
               "stream_options": {"include_usage": True}}
    gate = threading.Barrier(n)
    results: list[Request | BaseException] = [RuntimeError("no answer")] * n

    def worker(i: int) -> None:
        try:
            with httpx.Client(timeout=600, trust_env=False) as client:  # loopback: never a proxy
                gate.wait()
                results[i] = stream_one(client, url, payload)
        except BaseException as e:  # noqa: BLE001 (handed to the caller, raised there)
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for result in results:
        if isinstance(result, BaseException):
            raise RuntimeError(f"a stream failed: {result}") from result
    return Round(results)  # type: ignore[arg-type]


def nexttok_command(model: str, port: int, n: int) -> list[str]:
    return [sys.executable, "-m", "nexttok", "serve", model, "--host", "127.0.0.1", "--port", str(port),
            "--max-running", str(n), "--log-level", "warning"]


def llama_server_command(binary: Path, model: str, port: int, n: int, threads: int) -> list[str]:
    return [str(binary), "-m", model, "-np", str(n), "-c", str(n * CTX_PER_STREAM), "-t", str(threads),
            "--host", "127.0.0.1", "--port", str(port)]


def _child_env(threads: int) -> dict[str, str]:
    """The server's environment: torch's thread pool sized by OMP_NUM_THREADS (serve sets no threads
    of its own; torch reads it at start), and this very nexttok importable first."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    source = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([source] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


@contextmanager
def running(command: list[str], port: int, log: Path, env: dict[str, str]) -> Iterator[str]:
    """A server process (its own process group) until /health answers 200; its URL; then stopped,
    with everything it started, however the block ends."""
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(process, url, log)
        yield url
    finally:
        _stop(process)


def _wait_healthy(process: subprocess.Popen, url: str, log: Path, timeout: float = 600) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            lines = log.read_text(errors="replace").strip().splitlines() or ["no output"]
            raise RuntimeError(f"{Path(process.args[0]).name} exited ({process.returncode}): {lines[-1]} (log: {log})")
        try:
            if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not become healthy in {timeout:.0f} s (log: {log})")


def _stop(process: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def served_name(url: str) -> str:
    """The model name the server answers to (the first of GET /v1/models)."""
    import httpx

    return httpx.get(url + "/v1/models", timeout=10, trust_env=False).json()["data"][0]["id"]


@dataclass
class Spec:
    """What one benchmark runs: the model, the engines (llama-server's binary or None), the load."""

    model: str
    binary: Path | None
    threads: int = 2
    rounds: int = 3
    max_tokens: int = 128
    prompt: str = PROMPT
    logs: Path = field(default_factory=lambda: Path("/tmp"))

    @property
    def engines(self) -> tuple[str, ...]:
        return ENGINES if self.binary is not None else ENGINES[:1]


def one_round(spec: Spec, engine: str, n: int) -> Round:
    """Start `engine`'s server for n streams, warm it, fire n requests at once, stop it."""
    port = free_port()
    command = (nexttok_command(spec.model, port, n) if engine == "nexttok"
               else llama_server_command(spec.binary, spec.model, port, n, spec.threads))
    log = spec.logs / f"streams-{engine}-{n}.log"
    with running(command, port, log, _child_env(spec.threads)) as url:
        name = served_name(url)
        # warm-up (lazy setup, the file into memory) on another prompt: neither engine's prompt cache
        # holds the measured one, so every stream prefills it
        fire(url, name, 1, max_tokens=8, prompt=WARM_UP)
        return fire(url, name, n, max_tokens=spec.max_tokens, prompt=spec.prompt)


def measure(spec: Spec, n: int) -> dict[str, list[Round]]:
    """spec.rounds rounds at n streams, each engine once per round, the first alternating."""
    got: dict[str, list[Round]] = {engine: [] for engine in spec.engines}
    for r in range(spec.rounds):
        for engine in (spec.engines if r % 2 == 0 else spec.engines[::-1]):
            got[engine].append(one_round(spec, engine, n))
    return got


def _spread(values: list[float], digits: int = 1, unit: str = "") -> str:
    """median (range): _spread([1.0, 3.0, 2.0]) == "2.0 (1.0-3.0)"."""
    return f"{statistics.median(values):.{digits}f}{unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def engine_line(n: int, engine: str, rounds: list[Round]) -> str:
    """One row: streams, engine, aggregate tokens/s, tokens per round, TTFT p50 / p95 (ms)."""
    ttfts = [req.ttft * 1000 for rnd in rounds for req in rnd.requests]
    totals = sorted({rnd.tokens for rnd in rounds})
    tokens = str(totals[0]) if len(totals) == 1 else f"{totals[0]}-{totals[-1]}"
    return (f"{n:>7}  {engine:<13}{_spread([r.tokens_per_s for r in rounds]):>24}{tokens:>14}"
            f"{percentile(ttfts, 50):>12.0f}{percentile(ttfts, 95):>12.0f}")


def report(spec: Spec, results: dict[int, dict[str, list[Round]]]) -> str:
    """The table: per N a row per engine, then nexttok/llama-server's aggregate ratio."""
    ran = " vs ".join(f"{e} ({spec.binary})" if e == "llama-server" else "nexttok serve" for e in spec.engines)
    lines = [f"{ran} on {spec.model}: {spec.threads} threads each, {spec.rounds} round(s) alternating which runs "
             f"first, one server at a time; N concurrent streams of max_tokens {spec.max_tokens}, temperature 0; "
             "medians (range)",
             f"{'streams':>7}  {'engine':<13}{'aggregate tokens/s':>24}{'tokens/round':>14}"
             f"{'TTFT p50 ms':>12}{'TTFT p95 ms':>12}"]
    for n, got in results.items():
        lines += [engine_line(n, engine, rounds) for engine, rounds in got.items()]
        if len(got) == 2:
            ratios = [a.tokens_per_s / b.tokens_per_s for a, b in zip(got["nexttok"], got["llama-server"], strict=True)]
            lines.append(f"{n:>7}  nexttok/llama-server aggregate: {_spread(ratios, 2, 'x')}")
    return "\n".join(lines)


def run_streams(spec: Spec, streams: list[int], on_result=None) -> str:
    """Every N of `streams` measured in turn; the report. on_result(n, got) hears each N as it ends."""
    if spec.binary is not None and not spec.model.endswith(".gguf"):
        raise ValueError(f"llama-server runs a .gguf file; {spec.model} is not one")
    results = {}
    for n in streams:
        results[n] = measure(spec, n)
        if on_result is not None:
            on_result(n, results[n])
    return report(spec, results)
