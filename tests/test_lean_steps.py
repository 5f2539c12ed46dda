"""Only what is asked for is computed: a Step's logprob, rank and alternatives when a trace, logprobs
or a display wants them (issue 37), and start-up imports only what the command needs."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nexttok.checkpoints.gguf.reader import GGUFTensor
from nexttok.checkpoints.loading import load_model
from nexttok.cli import text, traces
from nexttok.generation.loop import build_step, generate
from nexttok.generation.sampling import SamplingParams
from nexttok.server.completions import GenerationPlan
from nexttok.server.ollama_options import plan_of
from nexttok.server.schemas import ChatRequest
from tiny_models import write_tiny

GREEDY = SamplingParams(temperature=0)
SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2")
    write_tiny("gpt2", directory)
    return load_model(directory)


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.9, top_k=20, seed=3)])
def test_steps_without_scores_hold_none_and_choose_the_same_tokens(tiny, gpt2, params):
    lean = generate(tiny, gpt2, [3, 17, 42], params, max_tokens=8, stop_token_ids=[], top_n=0, logprobs=False)
    full = generate(tiny, gpt2, [3, 17, 42], params, max_tokens=8, stop_token_ids=[])
    assert lean.token_ids == full.token_ids and lean.text == full.text
    assert all(s.logprob is None and s.rank is None and s.top == [] and s.top_filtered == [] for s in lean.steps)
    assert [s.token_text for s in lean.steps] == [s.token_text for s in full.steps]
    # what the trace path asks for (top_n=5, the default) is still there
    assert all(isinstance(s.logprob, float) and s.rank >= 1 and len(s.top) == 5 and s.top_filtered
               for s in full.steps)
    assert all(s.top[0].logprob >= s.logprob for s in full.steps)


def test_logprobs_without_alternatives(tiny, gpt2):
    steps = generate(tiny, gpt2, [3, 17], GREEDY, max_tokens=4, stop_token_ids=[], top_n=0).steps
    assert all(isinstance(s.logprob, float) and s.rank == 1 and s.top == [] for s in steps)


def test_build_step_without_scores_computes_no_log_softmax(gpt2, monkeypatch):
    logits = torch.randn(gpt2.vocab_size)
    calls = []
    real = torch.log_softmax
    monkeypatch.setattr(torch, "log_softmax", lambda *a, **k: calls.append(1) or real(*a, **k))
    step = build_step(gpt2, 5, logits, logits, None, index=0, elapsed=0.0, prefill=False, top_n=0, logprobs=False)
    assert calls == [] and step.logprob is None and step.token_text == gpt2.pieces([5])[0].text
    step = build_step(gpt2, 5, logits, logits, None, index=0, elapsed=0.0, prefill=False, top_n=0)
    assert calls and step.logprob == pytest.approx(float(real(logits, -1)[5]))


@pytest.mark.parametrize(("trace", "json_out", "wanted"), [(None, False, False), ("t.jsonl", False, True),
                                                          (None, True, True)])
def test_run_asks_for_scores_only_for_a_trace_or_json(trace, json_out, wanted):
    scores = text._scores(argparse.Namespace(trace=trace, json=json_out))
    assert scores == {"top_n": traces.TOP_N if wanted else 0, "logprobs": wanted}


@pytest.mark.parametrize(("fields", "logprobs", "top_n"), [
    ({}, False, 0), ({"logprobs": True}, True, 0), ({"logprobs": True, "top_logprobs": 3}, True, 3),
    ({"nexttok": {"trace": True}}, True, 0)])
def test_chat_plan_computes_logprobs_only_when_asked(fields, logprobs, top_n):
    body = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)
    plan = GenerationPlan.of(body, 4, top_n=(body.top_logprobs or 0) if body.logprobs else 0,
                             logprobs=bool(body.logprobs))
    assert (plan.logprobs, plan.top_n) == (logprobs, top_n)


def test_ollama_plan_computes_logprobs_only_when_asked():
    assert not plan_of(None).logprobs
    assert plan_of(None, logprobs=True).logprobs and plan_of(None, top_n=2).logprobs


def test_importing_the_cli_leaves_the_server_and_templates_out():
    code = ("import sys, nexttok.cli; print(' '.join(m for m in ('fastapi', 'starlette', 'uvicorn', 'jinja2', "
            "'jsonschema', 'gguf', 'yaml', 'nexttok.server') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}).stdout.split()
    assert loaded == []


def test_f32_and_f16_tensors_are_read_without_the_gguf_package():
    code = ("import sys, numpy as np; from nexttok.checkpoints.gguf.reader import GGUFTensor\n"
            "a = GGUFTensor('w', 'F16', (2, 3), np.arange(6, dtype=np.float16).reshape(2, 3)).dequantize()\n"
            "b = GGUFTensor('n', 'F32', (3,), np.array([1.5, 2, 3], dtype=np.float32)).dequantize()\n"
            "assert a.dtype == b.dtype == np.float32 and a.tolist() == [[0, 1, 2], [3, 4, 5]], a\n"
            "print('gguf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}).stdout.split()
    assert out == ["False"]


def test_f16_values_match_the_gguf_package():
    from gguf import GGMLQuantizationType, quants

    raw = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float16)
    ours = GGUFTensor("w", "F16", (4, 8), raw).dequantize()
    assert np.array_equal(ours, quants.dequantize(raw, GGMLQuantizationType.F16).reshape(4, 8))
