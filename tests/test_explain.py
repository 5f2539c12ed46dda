"""Explainer sessions: steps equal the generation loop, branches reuse the cached prefix, re-draws
run the same sampler chain; and the explainer's routes."""

from __future__ import annotations

import dataclasses
import math
import time

import httpx
import pytest
import torch

from nexttok.checkpoints.loading import load_model
from nexttok.errors import InvalidParameter
from nexttok.generation.loop import Generation, generate
from nexttok.generation.parameters import PARAMETERS
from nexttok.generation.sampling import SamplingParams, pick
from nexttok.generation.stages import History, MinP, Penalties, Temperature, TopK, TopP
from nexttok.lesson.session import ExplainSession
from nexttok.server import ServedModel
from nexttok.server.lesson.routes import RedrawRequest, StepRequest
from nexttok.server.schemas import SamplingFields
from tiny_models import write_tiny

GREEDY = SamplingParams(temperature=0)
PENALIZED = [
    SamplingParams(temperature=0.7, top_k=20, repetition_penalty=1.5),
    SamplingParams(temperature=1.3, top_p=0.9, presence_penalty=1.0, frequency_penalty=0.7),
    SamplingParams(temperature=0.9, min_p=0.05, repetition_penalty=1.3,
                   order=["temperature", "min_p", "penalties", "top_k"]),
    SamplingParams(temperature=0, repetition_penalty=2.0, frequency_penalty=2.0),
    SamplingParams(temperature=1.0, xtc_probability=0.6, xtc_threshold=0.05, dry_multiplier=1.0, dry_allowed_length=1,
                   typical_p=0.95, top_n_sigma=2.0, dynatemp_range=0.5, repeat_last_n=4, presence_penalty=0.5),
    SamplingParams(temperature=0.9, mirostat=2, mirostat_tau=3.0),  # mu follows the path, node by node
    SamplingParams(temperature=0.8, mirostat=1, mirostat_eta=0.3),
    SamplingParams(temperature=0, xtc_probability=1.0, xtc_threshold=0.02),  # greedy, and still XTC's chance
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("explain")
    write_tiny("llama_gqa_llama3_rope", directory)
    return load_model(directory)


def _comparable(step):
    """A Step without what only the generation loop knows (released text, finish) or measures."""
    return dataclasses.replace(step, text="", finish_reason=None, elapsed=0.0)


def test_greedy_steps_equal_generate(model, gpt2):
    prompt = [5, 9, 13]
    session = ExplainSession(model, gpt2, prompt)
    tokens = [session.step(GREEDY)["step"].token_id for _ in range(8)]
    assert tokens == generate(model, gpt2, prompt, GREEDY, max_tokens=8, stop_token_ids=[]).token_ids


@pytest.mark.parametrize("params", PENALIZED, ids=["top_k+repetition", "top_p+presence+frequency",
                                                   "order", "greedy+penalties", "dry+xtc+typical+sigma+dynatemp",
                                                   "mirostat2", "mirostat1", "greedy+xtc"])
def test_steps_equal_generation_for_the_same_logits_params_and_draws(model, gpt2, params):
    """The same seed gives the session and Generation the same u's (and XTC's chances); fed the
    session's logits, Generation makes the same Step, penalties and DRY of the path included, and
    Mirostat's mu as it moved along it."""
    prompt = [4, 4, 7, 9]
    session = ExplainSession(model, gpt2, prompt, seed=11)
    generation = Generation(model.config, gpt2, prompt, dataclasses.replace(params, seed=11), max_tokens=None,
                            stop_token_ids=[], top_n=10, record_stages=True)
    for _ in range(10):
        view = session.step(params)
        expected = generation.sample(session.forward(view["node"]).logits, 0.0, view["timing"]["prefill"])
        assert _comparable(view["step"]) == _comparable(expected)
        assert (view["step"].draw is None) == (params.temperature == 0)
    assert session.path(session.current) == generation.tokens
    seeded = dataclasses.replace(params, seed=11)
    assert generation.tokens == generate(model, gpt2, prompt, seeded, max_tokens=10, stop_token_ids=[]).token_ids


def test_timing_of_prefill_and_decode(model, gpt2):
    prompt = [1, 2, 3, 4, 5]
    session = ExplainSession(model, gpt2, prompt, seed=0)
    for tokens, prefill in ((len(prompt), True), (1, False), (1, False)):
        start = time.perf_counter()
        view = session.step(SamplingParams(temperature=0.8))
        wall = time.perf_counter() - start
        timing = view["timing"]
        assert timing["tokens"] == tokens and timing["prefill"] is prefill and view["step"].prefill is prefill
        assert 0 < timing["seconds"] <= view["step"].elapsed <= wall  # the Step adds the sampler's time


def test_view_carries_what_the_page_shows(model, gpt2):
    session = ExplainSession(model, gpt2, [1, 2, 3, 4], seed=0)
    view = session.step(SamplingParams(temperature=0.7, top_k=20, seed=0), top_n=12)
    assert "logits" not in view  # the whole vocabulary's logits stay on the server
    logits = session.forward(view["node"]).logits
    with torch.inference_mode():
        expected = model(torch.tensor([[1, 2, 3, 4]]))[0, -1]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    assert len(view["attention"]) == model.config.num_hidden_layers
    assert len(view["attention"][0]) == model.config.num_attention_heads and len(view["attention"][0][0]) == 4
    assert [s.name for s in view["step"].stages] == ["raw", "top_k", "temperature"]
    assert 0 <= view["step"].draw < 1
    p = expected.softmax(-1)
    final = Temperature(0.7).apply(TopK(20).apply(logits)).softmax(-1)
    assert [r["id"] for r in view["rows"]] == torch.topk(p, 12).indices.tolist()
    for row in view["rows"]:
        assert row["p"] == pytest.approx(float(p[row["id"]]), abs=1e-6)
        assert row["q"] == pytest.approx(float(final[row["id"]]), abs=1e-6)


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
    torch.testing.assert_close(session.forward(after["node"]).logits, expected, atol=1e-4, rtol=0)
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


def _by_hand(logits, history, params, order):
    """The chain's stages applied one by one, as an oracle for the re-draw."""
    make = {"penalties": lambda: Penalties(params.repetition_penalty, params.presence_penalty,
                                           params.frequency_penalty, history),
            "top_k": lambda: TopK(params.top_k), "top_p": lambda: TopP(params.top_p),
            "min_p": lambda: MinP(params.min_p), "temperature": lambda: Temperature(params.temperature)}
    for name in order:
        logits = make[name]().apply(logits)
    return logits


@pytest.mark.parametrize("order", [["penalties", "top_k", "top_p", "min_p", "temperature"],
                                   ["temperature", "min_p", "top_p", "top_k", "penalties"]])
def test_redraw_runs_the_chain_on_the_cached_logits(model, gpt2, order):
    prompt = [6, 6, 2]
    session = ExplainSession(model, gpt2, prompt, seed=3)
    steps = [session.step(GREEDY) for _ in range(3)]
    node = steps[-1]["node"]
    nodes, current = len(session.nodes), session.current
    assert steps[-1]["step"].draw is None  # greedy: the node had no u yet
    params = SamplingParams(temperature=0.6, top_k=12, top_p=0.8, min_p=0.02, repetition_penalty=1.8,
                            presence_penalty=0.5, order=order)
    view = session.redraw(params, node, top_n=15)
    assert len(session.nodes) == nodes and session.current == current  # nothing stepped
    u = session.nodes[node].draw
    assert view["step"].draw == u and 0 <= u < 1
    history = History.start(prompt, model.config.vocab_size)
    for token in session.path(node):
        history.add(token)
    logits = session.forward(node).logits
    final = _by_hand(logits, history, params, order)
    assert view["step"].token_id == pick(final, u)
    assert [s.name for s in view["step"].stages] == ["raw", *order]
    q = final.softmax(-1)
    for row in view["rows"]:
        assert row["q"] == pytest.approx(float(q[row["id"]]), abs=1e-6)
        cut_by = [s.name for s in view["step"].stages if row["id"] in s.cut]
        assert len(cut_by) == (1 if q[row["id"]] == 0 else 0)
    kept = [s.kept for s in view["step"].stages]
    assert kept[-1] == int((final > -math.inf).sum()) and kept[0] == model.config.vocab_size
    stepped = session.step(params, node_id=node, top_n=15)  # stepping with these dials: the same u
    assert stepped["step"].token_id == view["step"].token_id and stepped["step"].draw == u
    assert _comparable(stepped["step"]) == _comparable(view["step"]) and stepped["rows"] == view["rows"]


def test_bad_requests(model, gpt2):
    session = ExplainSession(model, gpt2, [1])
    with pytest.raises(InvalidParameter, match="node 99 does not exist"):
        session.step(GREEDY, 99)
    with pytest.raises(InvalidParameter, match="node 99 does not exist"):
        session.redraw(GREEDY, 99)
    with pytest.raises(InvalidParameter, match="token_id must be in 0..127"):
        session.step(GREEDY, 0, 500)
    with pytest.raises(InvalidParameter, match="the context window is 4"):
        ExplainSession(model, gpt2, [1] * 10, max_len=4)


# -- the routes -------------------------------------------------------------------------------


def _schema_bounds(model_class, name: str) -> dict:
    field = model_class.model_json_schema()["properties"][name]
    field = next((f for f in field.get("anyOf", []) if f.get("type") != "null"), field)
    keys = {"minimum": "ge", "exclusiveMinimum": "gt", "maximum": "le", "exclusiveMaximum": "lt"}
    return {keys[k]: v for k, v in field.items() if k in keys}


# The documented ranges, written out (OpenAI's for the penalties and top_p; llama.cpp / vLLM's for
# the rest): the schemas must say exactly these, whatever table they are built from.
DOCUMENTED = {"temperature": {"ge": 0.0}, "top_p": {"gt": 0.0, "le": 1.0}, "min_p": {"ge": 0.0, "le": 1.0},
              "repetition_penalty": {"gt": 0.0, "le": 100.0}, "presence_penalty": {"ge": -2.0, "le": 2.0},
              "frequency_penalty": {"ge": -2.0, "le": 2.0}, "top_k": {"ge": 0},
              # llama-server's stages (-1: the whole context for the windows, off for top-n-sigma)
              "repeat_last_n": {"ge": -1}, "dry_multiplier": {"ge": 0.0}, "dry_base": {"ge": 1.0},
              "dry_allowed_length": {"ge": 0}, "dry_penalty_last_n": {"ge": -1}, "top_n_sigma": {"ge": -1.0},
              "typical_p": {"gt": 0.0, "le": 1.0}, "xtc_probability": {"ge": 0.0, "le": 1.0},
              "xtc_threshold": {"ge": 0.0, "le": 1.0}, "dynatemp_range": {"ge": 0.0}, "dynatemp_exponent": {"ge": 0.0},
              "mirostat": {"ge": 0, "le": 2}, "mirostat_tau": {"ge": 0.0}, "mirostat_eta": {"ge": 0.0, "le": 1.0}}


@pytest.mark.parametrize("name", list(DOCUMENTED))
def test_request_bounds_are_the_documented_ranges(name):
    expected = DOCUMENTED[name]
    for request in (StepRequest, RedrawRequest):
        assert _schema_bounds(request, name) == expected
    if name == "top_k":  # the OpenAI-style routes also take vLLM's -1 for off
        expected = {**expected, "ge": -1}
    assert _schema_bounds(SamplingFields, name) == expected
    assert _schema_bounds(SamplingFields, "seed") == {"ge": 0, "lt": 2**63}


@pytest.fixture(scope="module")
def live(tiny_live):
    return tiny_live


def test_routes_step_and_redraw(live):
    server, served = live
    post = lambda path, body: httpx.post(server.url + path, json=body, timeout=60)  # noqa: E731
    table = httpx.get(server.url + "/explain/parameters", timeout=60).json()
    assert table["dials"]["top_p"] == PARAMETERS["top_p"].as_json() and table["dials"]["temperature"]["high"] is None
    assert table["order"] == list(SamplingParams().order) and set(table) == {"dials", "order", "stages"}
    key = post("/explain/sessions", {"prompt": "The capital of France is", "seed": 5}).json()["session"]
    first = post(f"/explain/sessions/{key}/step", {"temperature": 0.8, "top_k": 30}).json()
    dials = {"temperature": 1.2, "top_p": 0.7, "repetition_penalty": 1.6, "frequency_penalty": 0.4,
             "order": ["temperature", "top_p", "penalties"], "node": first["node"]}
    redrawn = post(f"/explain/sessions/{key}/redraw", dials).json()
    assert [s["name"] for s in redrawn["step"]["stages"]] == ["raw", "temperature", "top_p", "penalties"]
    assert redrawn["step"]["draw"] == first["step"]["draw"] and len(redrawn["rows"]) == 10
    session = ExplainSession(served.model, served.tokenizer, "The capital of France is", seed=5)
    params = SamplingParams(temperature=1.2, top_p=0.7, repetition_penalty=1.6, frequency_penalty=0.4,
                            order=["temperature", "top_p", "penalties"])
    session.step(SamplingParams(temperature=0.8, top_k=30))
    local = session.redraw(params, first["node"])
    assert redrawn["step"]["token_id"] == local["step"].token_id and redrawn["rows"] == local["rows"]
    bad = post(f"/explain/sessions/{key}/redraw", {**dials, "repetition_penalty": 101})
    assert bad.status_code == 400 and "repetition_penalty" in bad.text
    bad = post(f"/explain/sessions/{key}/redraw", {**dials, "order": ["top_k", "magic"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "order"
    assert post(f"/explain/sessions/{key}/redraw", {"node": 999}).status_code == 400


def test_explainer_state_is_not_the_served_models(live):
    """The explainer keeps its own per-model state (its lock): a ServedModel is shared with the
    scheduler, and nothing the page does changes it."""
    server, served = live
    before = {f.name: getattr(served, f.name) for f in dataclasses.fields(ServedModel)}
    key = httpx.post(server.url + "/explain/sessions", json={"prompt": "Hi", "seed": 1}, timeout=60).json()["session"]
    assert httpx.post(f"{server.url}/explain/sessions/{key}/step", json={}, timeout=60).status_code == 200
    after = {f.name: getattr(served, f.name) for f in dataclasses.fields(ServedModel)}
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
