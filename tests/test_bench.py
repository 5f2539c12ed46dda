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
                  "KV cache vs none", "llama.cpp", "speculative decoding (ngram drafts)"):
        assert label in out, out
    # a Llama-architecture model: llama.cpp's column is skipped with its reason (or runs when installed)
    assert "nexttok/llama.cpp" in out or "llama.cpp: skipped (" in out


def test_bench_rejects_bad_values(tiny_dir):
    result = subprocess.run([sys.executable, "-m", "nexttok", "bench", str(tiny_dir), "--repeat", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--repeat must be >= 1" in result.stderr


def test_bandwidth_is_measured():
    assert measure_read_bandwidth(megabytes=32, repeat=2) > 0.1
