"""Server metrics in Prometheus' text format (counters, gauges, histograms), thread-safe."""

from __future__ import annotations

import threading

COUNTERS = ("requests_total", "rejected_total", "cancelled_total", "timeouts_total", "failed_total",
            "tokens_generated_total", "decode_steps_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
            "prefix_cache_query_tokens_total", "prefix_cache_reused_tokens_total", "prefix_cache_evicted_tokens_total")
GAUGES = ("queue_depth", "running", "prefix_cache_tokens", "prefix_cache_capacity_tokens", "prefix_cache_checkpoints",
          "prefix_cache_checkpoint_tokens")
# gauges computed from two counters when scraped: name -> (numerator, denominator)
RATIOS = {"prefix_cache_hit_rate": ("prefix_cache_reused_tokens_total", "prefix_cache_query_tokens_total")}
HISTOGRAMS = {
    "time_to_first_token_seconds": (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    "time_per_output_token_seconds": (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0),
}
HELP = {
    "requests_total": "generation requests accepted",
    "rejected_total": "requests refused because the waiting line was full (HTTP 429)",
    "cancelled_total": "requests whose client went away before the end",
    "timeouts_total": "requests ended by the request timeout",
    "failed_total": "requests ended by an error inside generation",
    "tokens_generated_total": "tokens generated",
    "decode_steps_total": "batched decode forward passes (tokens generated / steps = mean batch size)",
    "prefix_cache_queries_total": "prompts looked up in the prefix cache",
    "prefix_cache_hits_total": "prompts that reused at least one cached block of keys and values",
    "prefix_cache_query_tokens_total": "prompt tokens looked up in the prefix cache",
    "prefix_cache_reused_tokens_total": "prompt tokens whose keys and values came from the prefix cache",
    "prefix_cache_evicted_tokens_total": "tokens evicted from the prefix cache to make room",
    "prefix_cache_tokens": "tokens whose keys and values the prefix cache holds",
    "prefix_cache_capacity_tokens": "tokens the prefix cache can hold (0: off)",
    "prefix_cache_checkpoints": "recurrent-state checkpoints the prefix cache holds (models with recurrent layers)",
    "prefix_cache_checkpoint_tokens": "capacity the checkpoints take, in tokens of keys and values of as many bytes",
    "prefix_cache_hit_rate": "prompt tokens reused / prompt tokens looked up, since the start",
    "queue_depth": "requests waiting for a batch slot",
    "running": "requests in the running batch",
    "time_to_first_token_seconds": "from arrival to the first generated token",
    "time_per_output_token_seconds": "between consecutive tokens of one request",
}


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._values = {name: 0 for name in (*COUNTERS, *GAUGES)}
        self._histograms = {name: ([0] * len(bounds), [0.0, 0]) for name, bounds in HISTOGRAMS.items()}

    def inc(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def set(self, name: str, value: int) -> None:
        with self._lock:
            self._values[name] = value

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            buckets, totals = self._histograms[name]
            for i, bound in enumerate(HISTOGRAMS[name]):
                if value <= bound:
                    buckets[i] += 1
            totals[0] += value
            totals[1] += 1

    def value(self, name: str) -> int:
        with self._lock:
            return self._values[name]

    def prometheus(self) -> str:
        lines = []
        with self._lock:
            for name, value in self._values.items():
                kind = "counter" if name in COUNTERS else "gauge"
                lines += [f"# HELP nexttok_{name} {HELP[name]}", f"# TYPE nexttok_{name} {kind}",
                          f"nexttok_{name} {value}"]
            for name, (buckets, (total, count)) in self._histograms.items():
                lines += [f"# HELP nexttok_{name} {HELP[name]}", f"# TYPE nexttok_{name} histogram"]
                for bound, n in zip(HISTOGRAMS[name], buckets, strict=True):
                    lines.append(f'nexttok_{name}_bucket{{le="{bound}"}} {n}')
                lines += [f'nexttok_{name}_bucket{{le="+Inf"}} {count}', f"nexttok_{name}_sum {total:.6f}",
                          f"nexttok_{name}_count {count}"]
            for name, (part, whole) in RATIOS.items():
                ratio = self._values[part] / self._values[whole] if self._values[whole] else 0.0
                lines += [f"# HELP nexttok_{name} {HELP[name]}", f"# TYPE nexttok_{name} gauge",
                          f"nexttok_{name} {ratio:.6f}"]
        return "\n".join(lines) + "\n"
