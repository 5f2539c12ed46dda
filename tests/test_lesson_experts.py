"""The lesson's mixture of experts (nexttok.lesson.experts), against HF transformers on the same tiny
random checkpoints: a session step's routing is HF's router at the position the step predicts from
(every expert's score from HF's router logits, the chosen experts and their weights from HF's router
modules themselves), and the parameter counts are the HF model's own parameters, part by part. The
explainer's routes send the library's values rounded for display, and nothing for a dense model."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import httpx
import pytest
import torch

from nexttok.checkpoints.export import write_gguf
from nexttok.checkpoints.loading import load_checkpoint, load_model
from nexttok.generation.sampling import SamplingParams
from nexttok.lesson.experts import expert_facts
from nexttok.lesson.session import ExplainSession
from nexttok.models import kernels
from tiny_models import GGUF_MOE, write_tiny, write_tiny_tokenizer

PROMPT = "the router picks"
FAMILIES = [*GGUF_MOE, "qwen3_moe_unnormed"]  # one per family, and one with a dense layer among the sparse


def write_moe_checkpoint(name: str, directory: Path):
    """A tiny random MoE checkpoint with a byte-level tokenizer, loadable as a whole; its HF model."""
    hf = write_tiny(name, directory)
    write_tiny_tokenizer(directory)
    return hf


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (the HF model, our Checkpoint of the same files), written once per module."""
    made = {}

    def get(name: str):
        if name not in made:
            directory = tmp_path_factory.mktemp(name)
            made[name] = write_moe_checkpoint(name, directory), load_checkpoint(directory)
        return made[name]

    return get


def _hf_routers(hf) -> list[tuple[int, torch.nn.Module]]:
    """HF's router modules (each returns router_logits, weights, indices) by layer."""
    found = [(int(re.search(r"layers\.(\d+)\.", name).group(1)), module) for name, module in hf.named_modules()
             if type(module).__name__.lower().endswith("router")]
    return sorted(found, key=lambda pair: pair[0])


def _hf_routing(hf, config, ids: list[int]) -> list[dict]:
    """HF's routing at the last position of ids, per sparse layer: probs from output_router_logits
    (softmax, or sigmoid for the sigmoid router), ids and weights as HF's router modules return them."""
    routers = _hf_routers(hf)
    chosen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [module.register_forward_hook(lambda _m, _i, out, layer=layer: chosen.__setitem__(layer, out[1:]))
             for layer, module in routers]
    try:
        with torch.no_grad():
            logits = hf(torch.tensor([ids]), output_router_logits=True).router_logits
    finally:
        for hook in hooks:
            hook.remove()
    logits = [r for r in logits if r is not None] if isinstance(logits, (list, tuple)) else [logits]
    out = []
    for (layer, _), row in zip(routers, logits, strict=True):
        last = row.view(len(ids), -1)[-1].float()
        probs = last.sigmoid() if config.router == "sigmoid" else last.softmax(-1)
        weights, experts = chosen[layer]
        out.append({"layer": layer, "probs": probs, "ids": experts.view(len(ids), -1)[-1],
                    "weights": weights.view(len(ids), -1)[-1].float()})
    return out


def _by_id(ids, weights) -> list[tuple[int, float]]:
    return sorted(zip(torch.as_tensor(ids).tolist(), torch.as_tensor(weights).tolist(), strict=True))


@pytest.mark.parametrize("name", FAMILIES)
def test_a_steps_routing_is_hfs_router(checkpoints, name):
    """Each step (the prefill, decode steps through the KV cache, one without it) carries, per sparse
    layer, the router's choice at the position it predicts from: HF's ids, weights and scores there."""
    hf, checkpoint = checkpoints(name)
    config, renormalised = checkpoint.model.config, expert_facts(checkpoint.model).renormalised
    session = ExplainSession(checkpoint.model, checkpoint.tokenizer, PROMPT, seed=0)
    for use_cache in (True, True, True, False):
        view = session.step(SamplingParams(temperature=0), use_cache=use_cache)
        ids = session.prompt_ids + session.path(view["node"])
        ours, ref = view["experts"], _hf_routing(hf, config, ids)
        assert [r["layer"] for r in ours] == [i for i, kind in enumerate(config.mlp_types) if kind == "sparse"]
        assert [r["layer"] for r in ours] == [r["layer"] for r in ref]
        for got, want in zip(ours, ref, strict=True):
            assert len(got["probs"]) == config.num_experts and len(got["ids"]) == config.num_experts_per_tok
            assert got["probs"] == pytest.approx(want["probs"].tolist(), abs=1e-5)
            shown, expected = _by_id(got["ids"], got["weights"]), _by_id(want["ids"], want["weights"])
            assert [i for i, _ in shown] == [i for i, _ in expected], (name, got["layer"])
            assert [w for _, w in shown] == pytest.approx([w for _, w in expected], abs=1e-5)
            if config.router == "softmax":  # the facts say whether HF's weights add up to 1
                assert (abs(float(want["weights"].sum()) - 1) < 1e-5) == renormalised
            if config.router != "sigmoid":  # the chosen are the k best scores (the sigmoid router: within groups)
                best = torch.tensor(got["probs"]).topk(config.num_experts_per_tok).indices
                assert sorted(got["ids"]) == sorted(best.tolist())


def _hf_mlp_parameters(hf) -> dict[str, int]:
    """The HF model's MLP parameters by part: routed experts, routers, shared experts, dense MLPs."""
    routers = {layer for layer, _ in _hf_routers(hf)}
    parts = dict.fromkeys(("routed", "router", "shared", "dense"), 0)
    for name, p in hf.named_parameters():
        found = re.match(r"model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.(.*)", name)
        if not found:
            continue
        layer, leaf = int(found.group(1)), found.group(3)
        part = ("dense" if layer not in routers else "routed" if leaf.startswith("experts.")
                else "shared" if leaf.startswith("shared_expert") else "router")
        parts[part] += p.numel()
    return parts


@pytest.mark.parametrize("name", FAMILIES)
def test_expert_facts_count_hfs_parameters(checkpoints, name):
    """Total vs active MLP parameters per token, counted from the config, are the HF model's own
    parameters part by part; a token reads k of E experts; the bytes are the loaded experts'."""
    hf, checkpoint = checkpoints(name)
    config, facts = checkpoint.model.config, expert_facts(checkpoint.model)
    parts = _hf_mlp_parameters(hf)
    assert (facts.routed, facts.router_parameters, facts.shared, facts.dense) == \
        (parts["routed"], parts["router"], parts["shared"], parts["dense"])
    assert facts.total == sum(parts.values())
    e, k = config.num_experts, config.num_experts_per_tok
    assert (facts.experts, facts.experts_per_token, facts.read_share) == (e, k, k / e)
    assert facts.routed_active * e == parts["routed"] * k
    assert facts.active == facts.total - parts["routed"] + facts.routed_active
    assert facts.sparse_layers + facts.dense_layers == config.num_hidden_layers
    assert facts.dense_layers == sum(1 for kind in config.mlp_types if kind == "dense")
    itemsize = next(checkpoint.model.parameters()).element_size()
    assert facts.expert_bytes == parts["routed"] * itemsize and facts.read_bytes * e == facts.expert_bytes * k


@pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: the kernels are not built")
def test_a_q8_0_gguf_s_experts_are_counted_in_their_blocks(checkpoints, tmp_path):
    """A GGUF's experts stay in blocks (Q8_0: 34 bytes per 32 weights): the counts are the
    checkpoint's, the bytes the blocks' own, and a decode step reads k / E of them."""
    _, checkpoint = checkpoints("qwen3_moe")
    path = write_gguf(checkpoint.path, tmp_path / "model-Q8_0.gguf", "Q8_0")
    shipped, float_facts = expert_facts(load_model(path)), expert_facts(checkpoint.model)
    assert dataclasses.replace(shipped, expert_bytes=0, read_bytes=0) == \
        dataclasses.replace(float_facts, expert_bytes=0, read_bytes=0)
    assert shipped.expert_bytes == shipped.routed * 34 // 32 < float_facts.expert_bytes
    assert shipped.read_bytes == shipped.expert_bytes * 2 // 8


def test_a_dense_model_has_no_router(tmp_path):
    """A dense model: no routing in a step, no expert facts."""
    write_tiny("qwen3", tmp_path)
    write_tiny_tokenizer(tmp_path)
    checkpoint = load_checkpoint(tmp_path)
    session = ExplainSession(checkpoint.model, checkpoint.tokenizer, PROMPT, seed=0)
    assert session.step(SamplingParams(temperature=0))["experts"] is None
    assert expert_facts(checkpoint.model) is None


@pytest.fixture(scope="module")
def moe_live(tmp_path_factory):
    """A live server over two tiny MoE checkpoints: qwen3_moe (softmax router, every layer sparse)
    and glm4_moe (sigmoid router in groups, a dense first layer, a shared expert)."""
    from live_server import LiveServer
    from nexttok.server import create_app, load_served

    served = []
    for name in ("qwen3_moe", "glm4_moe"):
        directory = tmp_path_factory.mktemp(f"served_{name}")
        write_moe_checkpoint(name, directory)
        served.append(load_served(str(directory), name))
    with LiveServer(create_app(served)) as server:
        yield server, {s.name: s for s in served}


def _post(server, path: str, body: dict) -> dict:
    response = httpx.post(server.url + path, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("name", ["qwen3_moe", "glm4_moe"])
def test_the_routes_send_the_librarys_routing_and_facts_rounded(moe_live, name):
    """The session's model facts are expert_facts' (5 significant digits); each step's experts are
    the library session's routing at the same step, weights and scores rounded to 4 places."""
    server, served = moe_live
    model = served[name].model
    started = _post(server, "/explain/sessions", {"prompt": PROMPT, "model": name, "seed": 1})
    facts = dataclasses.asdict(expert_facts(model))
    shown = started["model"]["moe"]
    assert shown.keys() == facts.keys()
    for field, value in facts.items():
        assert shown[field] == (pytest.approx(value, rel=1e-5) if isinstance(value, float) else value), field
    library = ExplainSession(model, served[name].tokenizer, PROMPT, seed=1)
    key = started["session"]
    for _ in range(3):  # the prefill, then decode steps through the cache
        view = _post(server, f"/explain/sessions/{key}/step", {"temperature": 0})
        expected = library.step(SamplingParams(temperature=0))
        assert view["step"]["token_id"] == expected["step"].token_id
        assert view["experts"] == [{"layer": r["layer"], "ids": r["ids"], "weights": [round(w, 4) for w in r["weights"]],
                                    "probs": [round(p, 4) for p in r["probs"]]} for r in expected["experts"]]
        assert len(view["experts"]) == model.config.mlp_types.count("sparse")


def test_a_dense_models_routes_carry_no_experts(tiny_live):
    """The dense test model: model.moe and each step's experts are null."""
    server, _ = tiny_live
    started = _post(server, "/explain/sessions", {"prompt": PROMPT})
    assert "moe" in started["model"] and started["model"]["moe"] is None
    view = _post(server, f"/explain/sessions/{started['session']}/step", {"temperature": 0})
    assert "experts" in view and view["experts"] is None
