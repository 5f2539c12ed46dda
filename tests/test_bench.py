"""Smoke test: the side-by-side benchmark runs and prints its table (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nexttok.benchmark import measure_read_bandwidth
from tiny_models import write_tiny_with_gpt2_tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, gpt2_dir):
    directory = tmp_path_factory.mktemp("bench_model")
    write_tiny_with_gpt2_tokenizer("llama_long_context", directory, gpt2_dir)
    return directory


def test_bench_prints_the_table(tiny_dir):
    result = subprocess.run(
        [sys.executable, "-m", "nexttok", "bench", str(tiny_dir), "--new-tokens", "4", "--prompt-tokens", "16",
         "--repeat", "1"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for label in ("decode tokens/s", "prefill tokens/s", "time to first token", "peak RSS", "nexttok/hf", "roofline",
                  "KV cache vs none", "llama.cpp", "speculative decoding (ngram drafts)", "cache held at 4096 tokens"):
        assert label in out, out
    # a Llama-architecture model: llama.cpp's column is skipped with its reason (or runs when installed)
    assert "nexttok/llama.cpp" in out or "llama.cpp: skipped (" in out


def test_bench_rejects_bad_values(tiny_dir):
    result = subprocess.run([sys.executable, "-m", "nexttok", "bench", str(tiny_dir), "--repeat", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--repeat must be >= 1" in result.stderr


def test_bandwidth_is_measured():
    assert measure_read_bandwidth(megabytes=32, repeat=2) > 0.1


@pytest.mark.parametrize("name", ["gemma3", "lfm2"])
def test_cache_held_is_what_generations_cache_holds_by_layer_type(pairs, name):
    """The bench's line on the cache: the bytes of generation's (windowed) cache at the context, by
    layer type, equal to a real cache's after that many tokens; recurrent states measured."""
    import torch

    from nexttok.benchmark import cache_held, held_line
    from nexttok.generation.prefill import prefill
    from nexttok.models.cache import KVCache

    _, ours, _ = pairs(name)
    held = cache_held(ours, 16384)  # more than the model's context: its own (256) instead
    cache = KVCache.for_model(ours.config, max_len=256, windowed=True)
    with torch.inference_mode():
        prefill(ours, cache, [i % 100 for i in range(250)])
    assert {k: held[k] for k in ("full", "sliding", "recurrent")} == cache.held_bytes()
    assert held["context"] == 256 and held["all_full"] == KVCache.for_model(ours.config, max_len=256).k.numel() * 8 \
        * ours.config.num_hidden_layers // len(ours.config.attention_layers)
    line = held_line(held)
    assert line.startswith("cache held at 256 tokens: full layers ") and ("sliding layers" in line) == (name == "gemma3")
    assert ("recurrent states" in line) == (name == "lfm2")
