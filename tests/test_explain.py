"""Explainer sessions: steps equal the generation loop, branches reuse the cached prefix."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from nexttok.errors import InvalidParameter
from nexttok.explain import ExplainSession
from nexttok.generate import generate
from nexttok.sampling import SamplingParams
from nexttok.weights import load_model
from tiny_models import write_tiny

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("explain")
    write_tiny("llama_gqa_llama3_rope", directory)
    return load_model(directory)


def test_greedy_steps_equal_generate(model, gpt2):
    prompt = [5, 9, 13]
    session = ExplainSession(model, gpt2, prompt)
    tokens = [session.step(GREEDY)["step"].token_id for _ in range(8)]
    assert tokens == generate(model, gpt2, prompt, GREEDY, max_tokens=8, stop_token_ids=[]).token_ids


def test_view_carries_what_the_page_redraws(model, gpt2):
    session = ExplainSession(model, gpt2, [1, 2, 3, 4], seed=0)
    view = session.step(SamplingParams(temperature=0.7, top_k=20, seed=0))
    logits = np.frombuffer(base64.b64decode(view["logits"]), dtype="<f4")
    with torch.inference_mode():
        expected = model(torch.tensor([[1, 2, 3, 4]]))[0, -1].numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-5)
    assert view["timing"] == {"tokens": 4, "seconds": view["timing"]["seconds"], "prefill": True}
    assert len(view["attention"]) == model.config.num_hidden_layers
    assert len(view["attention"][0]) == model.config.num_attention_heads and len(view["attention"][0][0]) == 4
    assert [s.name for s in view["step"].stages] == ["raw", "top_k", "temperature"]
    assert 0 <= view["step"].draw < 1
    second = session.step(GREEDY)
    assert second["timing"]["tokens"] == 1 and not second["timing"]["prefill"]


def test_branch_reuses_the_prefix_and_matches_recompute(model, gpt2):
    session = ExplainSession(model, gpt2, [7, 8, 9])
    first = [session.step(GREEDY) for _ in range(4)]
    branch_at = first[2]["node"]  # continue the third step with another token
    alternative = first[2]["step"].top[1].id
    view = session.step(GREEDY, branch_at, alternative)
    assert view["step"].token_id == alternative and session.current == view["child"]
    after = session.step(GREEDY)
    assert after["timing"]["tokens"] == 1  # only the new token went through the model
    path = [7, 8, 9, *session.path(after["node"])]
    with torch.inference_mode():
        expected = model(torch.tensor([path]))[0, -1]
    got = torch.from_numpy(np.frombuffer(base64.b64decode(after["logits"]), dtype="<f4").copy())
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    parent = session.nodes[branch_at]
    assert len(parent.children) == 2
    session.goto(first[1]["child"])
    assert session.path(session.current) == session.path(first[1]["child"])


def test_same_draw_is_kept_per_node(model, gpt2):
    session = ExplainSession(model, gpt2, [3, 4], seed=1)
    hot = SamplingParams(temperature=1.5)
    view = session.step(hot)
    again = session.step(hot, node_id=view["node"])
    assert again["step"].draw == view["step"].draw and again["child"] == view["child"]


def test_bad_requests(model, gpt2):
    session = ExplainSession(model, gpt2, [1])
    with pytest.raises(InvalidParameter, match="node 99 does not exist"):
        session.step(GREEDY, 99)
    with pytest.raises(InvalidParameter, match="token_id must be in 0..127"):
        session.step(GREEDY, 0, 500)
    with pytest.raises(InvalidParameter, match="the context window is 4"):
        ExplainSession(model, gpt2, [1] * 10, max_len=4)
