"""Limits and untrusted input: body size, model names that look like paths, max_tokens capped by
the context, and property tests for the sampler and tokenizer on hostile values."""

from __future__ import annotations

import math

import httpx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from live_server import LiveServer
from nexttok.generation.sampling import SamplerChain, SamplingParams
from nexttok.server import ServerLimits, create_app, load_served
from nexttok.tokenizers import tokenizer as tokenizer_module

MODEL = "tiny"


@pytest.fixture(scope="module")
def live(chat_model_dir):
    limits = ServerLimits(max_body_bytes=8192, max_model_len=128)
    with LiveServer(create_app([load_served(str(chat_model_dir), MODEL)], limits=limits)) as server:
        yield server


def _post(live, path, **kwargs):
    return httpx.post(live.url + path, timeout=60, **kwargs)


def test_body_over_the_limit_is_413(live):
    big = {"model": MODEL, "prompt": "x" * 10_000}
    response = _post(live, "/v1/completions", json=big)
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"

    def chunks():  # no Content-Length: counted while reading
        for _ in range(20):
            yield b" " * 1000

    response = _post(live, "/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "/etc/passwd", "~/.ssh/id_rsa", "gpt2",
                                  "smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M", "tiny/../tiny"])
def test_only_served_models_are_reachable(live, name):
    for path, body in (("/v1/completions", {"model": name, "prompt": "x", "max_tokens": 1}),
                       ("/tokenize", {"model": name, "prompt": "x"}),
                       ("/explain/sessions", {"model": name, "prompt": "x"})):
        response = _post(live, path, json=body)
        assert response.status_code == 404, (path, response.text)
        assert response.json()["error"]["code"] == "model_not_found"


def test_max_tokens_is_capped_by_the_context(live):
    body = {"model": MODEL, "prompt": "Count", "max_tokens": 1_000_000, "temperature": 1.0,
            "logit_bias": {"50256": -100}}
    result = _post(live, "/v1/completions", json=body).json()
    prompt = result["usage"]["prompt_tokens"]
    assert result["usage"]["completion_tokens"] == 128 - prompt
    assert result["choices"][0]["finish_reason"] == "length"


def test_prompt_beyond_the_server_context(live):
    response = _post(live, "/v1/completions", json={"model": MODEL, "prompt": "word " * 200})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(logits=st.lists(finite, min_size=2, max_size=40), temperature=st.floats(0, 3), top_p=st.floats(0.01, 1),
       top_k=st.integers(0, 50), min_p=st.floats(0, 1), seed=st.integers(0, 2**32))
def test_sampler_always_returns_a_kept_token(logits, temperature, top_p, top_k, min_p, seed):
    values = torch.tensor(logits)
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
    chain = SamplerChain.from_params(params, len(logits))
    chosen = chain.sample(values)
    token = chosen.token_id
    assert 0 <= token < len(logits)
    assert chosen.logits[token] > -math.inf
    if temperature < 1e-5:  # greedy
        assert values[token] == values.max()


@settings(max_examples=100, deadline=None)
@given(logits=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=2, max_size=20))
def test_sampler_refuses_non_finite_logits(logits):
    values = torch.tensor(logits, dtype=torch.float32)
    chain = SamplerChain.from_params(SamplingParams(seed=0), len(logits))
    broken = bool(torch.isnan(values).any() or (values == math.inf).any() or (values == -math.inf).all())
    if broken:
        with pytest.raises(ValueError, match="NaN|inf"):
            chain.sample(values)
    else:
        assert values[chain.sample(values).token_id] > -math.inf


@settings(max_examples=50, deadline=None)
@given(prefix=st.text(max_size=20), suffix=st.text(max_size=20),
       surrogate=st.integers(0xD800, 0xDFFF))
def test_lone_surrogates_are_refused_clearly(gpt2, prefix, suffix, surrogate):
    text = prefix + chr(surrogate) + suffix
    with pytest.raises(ValueError, match=f"lone surrogate .* at index {len(prefix)}"):
        gpt2.encode(text)


def test_huge_input_keeps_the_word_cache_bounded(gpt2, monkeypatch):
    monkeypatch.setattr(tokenizer_module, "_CACHE_LIMIT", 1000)
    gpt2._cache.clear()
    words = " ".join(f"w{i:x}q" for i in range(30_000))  # 30,000 distinct words, ~250 KB
    ids = gpt2.encode(words)
    assert gpt2.decode(ids) == words
    assert 0 < len(gpt2._cache) <= 1000  # cleared whenever it reached the limit
