"""bench_native: nexttok against llama.cpp's own llama-bench, alternating rounds. The comparison's
plumbing runs against a stand-in llama-bench (a script printing llama-bench's JSON), so it is tested
here without llama.cpp; never a timed test (the figures are the bench's, not the tests')."""

from __future__ import annotations

import json
import stat

import pytest

from nexttok.bench_native import Rounds, compare, llama_bench, llama_cpp_bin


def fake_llama_bench(folder, tg: float = 50.0, pp: float = 400.0, fail: bool = False):
    """A llama-bench that answers as the real one does with -o json (one result per test), and
    logs its arguments."""
    results = [{"n_prompt": 0, "n_gen": 1, "avg_ts": tg}, {"n_prompt": 1, "n_gen": 0, "avg_ts": pp}]
    script = folder / "llama-bench"
    body = "echo 'error: failed to load model' >&2; exit 1" if fail else f"echo '{json.dumps(results)}'"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {folder}/calls\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder


def test_the_folder_is_the_flags_then_the_environments(tmp_path, monkeypatch):
    fake_llama_bench(tmp_path)
    assert llama_cpp_bin(str(tmp_path)) == tmp_path
    monkeypatch.setenv("NEXTTOK_LLAMA_CPP_BIN", str(tmp_path))
    assert llama_cpp_bin() == tmp_path
    with pytest.raises(ValueError, match=r"no llama-bench in /nonexistent \(build it with"):
        llama_cpp_bin("/nonexistent")


def test_llama_bench_is_read_from_its_json_and_a_failure_is_one_line(tmp_path):
    fake_llama_bench(tmp_path, tg=61.5, pp=321.0)
    assert llama_bench(tmp_path, "m.gguf", 2, 64, 16) == {"decode_tps": 61.5, "prefill_tps": 321.0}
    assert (tmp_path / "calls").read_text().split() == ["-m", "m.gguf", "-t", "2", "-p", "64", "-n", "16", "-r", "1",
                                                       "-o", "json"]
    fake_llama_bench(tmp_path, fail=True)
    with pytest.raises(RuntimeError, match="^llama-bench failed: error: failed to load model$"):
        llama_bench(tmp_path, "m.gguf", 2, 64, 16)


def test_rounds_report_medians_with_their_ranges():
    line = Rounds([90.0, 120.0, 100.0], [100.0, 100.0, 80.0]).line("decode")
    assert "100.0 (90.0-120.0)" in line and "100.0 (80.0-100.0)" in line and "1.20x (0.90-1.25)" in line


def test_a_comparison_alternates_the_engines_on_a_real_gguf(tmp_path, written_gguf):
    _, path = written_gguf("qwen2", "Q8_0")
    fake_llama_bench(tmp_path, tg=50.0, pp=400.0)
    report = compare(str(path), tmp_path, threads=1, prompt=16, new=4, rounds=2)
    decode, sampled, prefill = (next(line for line in report.splitlines() if line.startswith(w))
                                for w in ("decode tg4 greedy", "decode tg4 sampled", "prefill"))
    assert "50.0 (50.0-50.0)" in decode and "50.0 (50.0-50.0)" in sampled  # both against the one tg
    assert "pp16" in prefill and "400.0 (400.0-400.0)" in prefill
    assert float(decode.split()[3]) > 0 and float(sampled.split()[3]) > 0  # nexttok's medians, measured
    assert "llama.cpp's default sampling (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8)" in report
    assert len((tmp_path / "calls").read_text().splitlines()) == 3  # a warm-up and one run per round


def test_only_a_gguf_is_compared(tmp_path):
    with pytest.raises(ValueError, match="llama-bench runs a .gguf file; model-dir is not one"):
        compare("model-dir", fake_llama_bench(tmp_path))
