"""bench/scale.py's GGUF writer at its tiny shape: the random-weight F16 file loads in nexttok with the
shape's config and runs a forward. Pure Python (no llama.cpp, no quantize); never a timed test."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from nexttok.checkpoints.loading import load_model

SCALE = Path(__file__).resolve().parent.parent / "bench" / "scale.py"


def scale_module():
    if "bench_scale" in sys.modules:
        return sys.modules["bench_scale"]
    spec = importlib.util.spec_from_file_location("bench_scale", SCALE)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_scale", module)  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_tiny_random_gguf_loads_and_runs(tmp_path):
    scale = scale_module()
    if not scale.TOKENIZER_SOURCE.is_file():
        pytest.skip(f"no {scale.TOKENIZER_SOURCE} to copy the tokenizer metadata from")
    shape = scale.SHAPES["tiny"]
    path = tmp_path / "tiny-f16.gguf"
    scale.write_gguf(path, shape)
    model = load_model(path)
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (256, 2, 4, 2)
    assert (c.head_dim, c.intermediate_size, c.vocab_size) == (64, 512, 151936)
    assert c.rope_theta == pytest.approx(1e6)
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]]))
    assert logits.shape[-1] == 151936 and torch.isfinite(logits).all()


def test_unsupported_shape_says_why():
    scale = scale_module()
    assert "tokenizer" in scale.UNSUPPORTED["llama-3.2-3b"]
    names = [name for name, _ in scale.tensor_shapes(scale.SHAPES["qwen2.5-1.5b"])]
    assert "output.weight" not in names and "blk.27.attn_q.bias" in names  # tied, q/k/v biases


def test_rounds_split_by_the_memorys_state():
    """Rounds whose bandwidth took two levels are reported per level; one level is said as such."""
    by_state = scale_module().by_state
    report = by_state([33.6, 65.3, 36.5, 60.0, 34.0, 61.0], [86, 64, 88, 70, 85, 40], [1.0, 1.31, 0.95, 1.2, 1.07, 0.9],
                      [True, True, True, True, True, False])
    assert report.splitlines() == [
        "by the memory's state (1 of 6 rounds straddled a flip, left out):",
        "  memory >= 49 GB/s: 2 rounds, roofline 67% (64-70%), greedy decode 1.25x (1.20-1.31) llama-bench",
        "  memory < 49 GB/s: 3 rounds, roofline 86% (85-88%), greedy decode 1.00x (0.95-1.07) llama-bench"]
    assert by_state([33.6, 60.0], [86, 50], [1.0, 1.1], [True, False]).splitlines()[1] == \
        "  memory >= 47 GB/s: no steady round"
    assert by_state([33.6, 36.5], [86, 88], [1.0, 1.1], [True, True]) == "the memory held one state over the rounds"


def test_a_files_report_has_its_states(tmp_path, monkeypatch, capsys):
    """_one, given each round's rates and bandwidths (no engines run), prints the roofline per state
    and returns the summary row."""
    from types import SimpleNamespace

    from nexttok import bench_native

    def measure(path, binary, *, memory, **kw):
        memory.extend([(35.0, 10**9, True), (60.0, 10**9, True), (34.0, 10**9, True)])
        return {key: bench_native.Rounds(ours, [30.0, 30.0, 30.0])
                for key, ours in (("decode_tps", [30.0, 42.0, 29.0]), ("sampled_tps", [29.0, 40.0, 28.0]),
                                  ("prefill_tps", [150.0, 150.0, 150.0]))}

    monkeypatch.setattr(bench_native, "measure", measure)
    monkeypatch.setattr(bench_native, "table", lambda *a, **k: "")
    path = tmp_path / "x.gguf"
    path.write_bytes(b"0" * 1000)
    row = scale_module()._one("Q4_K_M", path, tmp_path, SimpleNamespace(threads=2, prompt_tokens=512, new_tokens=128,
                                                                         rounds=3))
    out = capsys.readouterr().out
    assert "memory >= 47 GB/s: 1 rounds, roofline 70% (70-70%), greedy decode 1.40x (1.40-1.40)" in out
    assert "memory < 47 GB/s: 2 rounds, roofline 86% (85-86%), greedy decode 0.98x (0.97-1.00)" in out
    assert row.startswith("Q4_K_M") and row.endswith("85%")
