"""The lesson's layer types (nexttok.lesson.layers) on tiny random HF checkpoints of a hybrid (LFM2:
convolutions around one attention layer), sliding-window models (Gemma 3: local and global layers;
Mistral: every layer slides) and a plain one (Qwen2): each layer's kind and index is the config's;
each attention entry of a step and of an inspection is HF's attention of the layer it is labelled
with; a recurrent layer has no weights and its state is the one the cache keeps, the same size at
any length; the bytes per layer type are KVCache.held_bytes() of generation's cache after that many
tokens. The routes send the same."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from nexttok.checkpoints.loading import load_checkpoint
from nexttok.errors import InvalidParameter
from nexttok.generation.prefill import prefill
from nexttok.generation.sampling import SamplingParams
from nexttok.lesson import sections as lesson
from nexttok.lesson.layers import cache_memory, layer_table
from nexttok.lesson.session import ExplainSession
from nexttok.models.cache import WINDOW_CHUNK, WINDOW_SLACK, KVCache
from tiny_models import random_ids, write_tiny, write_tiny_tokenizer

NAMES = ["lfm2", "gemma3", "mistral", "qwen2"]
PROMPT = "the quick brown fox jumps over the lazy dog"


def write_layered_checkpoint(name: str, directory: Path):
    """A tiny random checkpoint with a byte-level tokenizer, loadable as a whole; its HF model."""
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
            made[name] = write_layered_checkpoint(name, directory), load_checkpoint(directory)
        return made[name]

    return get


def _hf_attentions(hf, ids: list[int]) -> list[torch.Tensor]:
    """HF's attention weights (n_head, T, T) of each layer that attends, in layer order."""
    with torch.no_grad():
        return [a[0] for a in hf(torch.tensor([ids]), output_attentions=True).attentions]


@pytest.mark.parametrize("name", NAMES)
def test_the_layer_table_is_the_configs(checkpoints, name):
    """Kinds and indices as config.layer_types says, windows on the sliding layers; a recurrent layer's
    state is the cache's own tensors, one sequence's row, the same size after 3 tokens or 120."""
    _, checkpoint = checkpoints(name)
    model, config = checkpoint.model, checkpoint.model.config
    table = layer_table(model)
    assert [(k.layer, k.kind) for k in table] == list(enumerate(config.layer_types))
    assert [k.layer for k in table if k.recurrent] == config.recurrent_layers
    assert [k.window for k in table] == [config.sliding_window if kind == "sliding_attention" else None
                                         for kind in config.layer_types]
    for length in (3, 120):
        cache = KVCache.for_model(config, max_len=length, windowed=True)
        prefill(model, cache, random_ids(length, seed=length)[0].tolist())
        assert {(k.layer, s.name): (s.shape, s.bytes) for k in table for s in k.states} == \
            {key: (tuple(t.shape[1:]), t[0].numel() * t.element_size()) for key, t in cache.states.items()}
        assert sum(k.bytes for k in table) == cache.held_bytes()["recurrent"]
    for k in table:
        if k.kind == "conv":  # LFM2's short convolution keeps its last kernel - 1 inputs of every channel
            assert k.inputs == config.conv_kernel - 1 and k.numbers == config.hidden_size * k.inputs
        assert bool(k.states) == k.recurrent and (k.inputs is not None) == (k.kind == "conv")


@pytest.mark.parametrize("name", NAMES)
def test_each_attention_entry_is_hfs_attention_of_its_layer(checkpoints, name):
    """A step's attention (the last position, per attention layer) and an inspection's matrices are
    labelled with the model's own layer indices, and each is HF's attention of that very layer: the
    prefill, steps through the cache, and one without it. A recurrent layer has none, by name."""
    hf, checkpoint = checkpoints(name)
    config = checkpoint.model.config
    session = ExplainSession(checkpoint.model, checkpoint.tokenizer, PROMPT, seed=0)
    for use_cache in (True, True, False):
        view = session.step(SamplingParams(temperature=0), use_cache=use_cache)
        ids = session.prompt_ids + session.path(view["node"])
        reference = _hf_attentions(hf, ids)
        assert view["attention_layers"] == config.attention_layers
        assert len(view["attention"]) == len(view["attention_mean"]) == len(reference)
        for weights, mean, ref in zip(view["attention"], view["attention_mean"], reference, strict=True):
            torch.testing.assert_close(torch.tensor(weights), ref[:, -1], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(torch.tensor(mean), ref[:, -1].mean(0), atol=1e-5, rtol=1e-4)
    seen = session.inspect(view["child"])
    reference = _hf_attentions(hf, seen.ids)
    assert seen.layers == config.attention_layers and seen.layer_types == config.layer_types
    for entry, layer in enumerate(config.attention_layers):
        torch.testing.assert_close(lesson.attention_matrix(seen, layer, 1), reference[entry][1], atol=1e-5, rtol=1e-4)
        window = config.sliding_window if config.layer_types[layer] == "sliding_attention" else None
        detail = lesson.attention_detail(seen, layer, 0, -1)
        assert detail["first"] == (len(seen.ids) - window if window else 0)  # the window's first key
        torch.testing.assert_close(detail["weights"], reference[entry][0, -1, detail["first"] :], atol=1e-5, rtol=1e-4)
        if window:  # keys older than the window: no weight in HF's matrix either
            assert float(reference[entry].tril(-window).abs().max()) == 0
    for layer in config.recurrent_layers:
        with pytest.raises(InvalidParameter, match=rf"layer {layer} is a recurrent layer \(conv\): it keeps a state"):
            lesson.attention_matrix(seen, layer, None)
    with pytest.raises(InvalidParameter, match=rf"layer must be in 0..{config.num_hidden_layers - 1}"):
        lesson.attention_detail(seen, config.num_hidden_layers, 0, 0)


def _generations_cache(model, ids: list[int]) -> dict[str, int]:
    """held_bytes() of generation's cache (windowed, sized to the sequence) once ids are prefilled."""
    cache = KVCache.for_model(model.config, max_len=len(ids), windowed=True)
    prefill(model, cache, ids)
    return cache.held_bytes()


@pytest.mark.parametrize("name", NAMES)
def test_the_bytes_per_layer_type_are_generations_cache(checkpoints, name):
    """At a short prompt and one longer than a window and its room (200 tokens): the step's bytes per
    layer type are KVCache.held_bytes() of generation's cache holding that many tokens, and the
    model's whole context likewise; a cache of every layer full grows by 2 × layers × KV heads ×
    head_dim × 4 bytes a token. Sliding layers stop at their window and its room, states stay one size."""
    _, checkpoint = checkpoints(name)
    model, config = checkpoint.model, checkpoint.model.config
    full_layer_token = 2 * config.num_key_value_heads * config.head_dim * 4  # float32 on the CPU
    for length in (9, 200):
        ids = random_ids(length, seed=length)[0].tolist()
        session = ExplainSession(model, checkpoint.tokenizer, ids, seed=0)
        cache = session.step(SamplingParams(temperature=0))["cache"]
        for at, tokens in ((cache["held"], length), (cache["full_context"], config.max_position_embeddings)):
            held = _generations_cache(model, random_ids(tokens, seed=5)[0].tolist())
            assert at["tokens"] == tokens
            assert {k: at[k] for k in held} == held, (name, tokens)
            assert at["total"] == sum(held.values())
            assert at["all_full"] == config.num_hidden_layers * full_layer_token * tokens
            sliding = config.layer_types.count("sliding_attention")
            slots = min(tokens, config.sliding_window + WINDOW_SLACK + WINDOW_CHUNK) if sliding else 0
            assert at["sliding_slots"] == slots and at["sliding"] == sliding * full_layer_token * slots
            assert at["full"] == config.layer_types.count("full_attention") * full_layer_token * tokens
            assert at["sliding_room"] == (WINDOW_SLACK + WINDOW_CHUNK if sliding else 0)
        assert cache["held"]["recurrent"] == cache["full_context"]["recurrent"] == \
            sum(layer.bytes for layer in session.layers)
        assert (cache["held"]["recurrent"] > 0) == bool(config.recurrent_layers)
        assert cache["bytes_per_token"] == len(config.attention_layers) * full_layer_token  # this session's own
    if name == "qwen2":  # nothing to save: every layer keeps every key
        assert cache["held"]["total"] == cache["held"]["all_full"] == cache["bytes"]
    else:
        assert cache["full_context"]["total"] < cache["full_context"]["all_full"]


def test_a_sliding_window_models_memory_at_16k_tokens():
    """The issue's arithmetic at a long context, on the meta device: a Mistral-7B-shaped config (every
    layer slides, window 4096) holds 32 layers × the window and its room, not 32 × 16,384 tokens; a
    Gemma-3-shaped one (5 local layers of 1024 per global) holds its global layers' 16,384."""
    from nexttok.models.config import ModelConfig

    shape = dict(model_type="mistral", vocab_size=32000, hidden_size=4096, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                 max_position_embeddings=32768, sliding_window=4096)
    memory = cache_memory(ModelConfig(**shape), 16384, torch.bfloat16, 0)
    per_slot = 2 * 8 * 128 * 2  # a key and a value, 8 heads of 128, bfloat16
    assert memory.full == 0 and memory.sliding == 32 * per_slot * (4096 + WINDOW_SLACK + WINDOW_CHUNK)
    assert memory.all_full == 32 * per_slot * 16384 and memory.sliding_slots == 4256
    gemma = ModelConfig(**{**shape, "num_hidden_layers": 6, "sliding_window": 1024,
                           "layer_types": ["sliding_attention"] * 5 + ["full_attention"]})
    memory = cache_memory(gemma, 16384, torch.bfloat16, 0)
    assert memory.full == per_slot * 16384 and memory.sliding == 5 * per_slot * 1184


@pytest.fixture(scope="module")
def layered_live(tmp_path_factory):
    """A live server over tiny lfm2, gemma3 and qwen2 checkpoints."""
    from live_server import LiveServer
    from nexttok.server import create_app, load_served

    served = []
    for name in ("lfm2", "gemma3", "qwen2"):
        directory = tmp_path_factory.mktemp(f"served_{name}")
        write_layered_checkpoint(name, directory)
        served.append(load_served(str(directory), name))
    with LiveServer(create_app(served)) as server:
        yield server, {s.name: s for s in served}


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


@pytest.mark.parametrize("name", ["lfm2", "gemma3", "qwen2"])
def test_the_routes_send_each_layers_kind_and_the_librarys_numbers(layered_live, name):
    """The session's model.layer_types is the library's table; each step's attention_layers and cache
    are the library session's at the same step; the attention view of every layer by its own index:
    its kind and window with the inspection's matrix, or for a recurrent layer its state and no
    weights (and the worked head refused, naming the layer)."""
    server, served = layered_live
    model, config = served[name].model, served[name].model.config
    started = _post(server, "/explain/sessions", {"prompt": PROMPT, "model": name, "seed": 1}).json()
    library = ExplainSession(model, served[name].tokenizer, PROMPT, seed=1)
    assert started["model"]["layer_types"] == [k.as_json() for k in library.layers]
    assert [(k["layer"], k["kind"]) for k in started["model"]["layer_types"]] == list(enumerate(config.layer_types))
    key = started["session"]
    for _ in range(2):
        view = _post(server, f"/explain/sessions/{key}/step", {"temperature": 0}).json()
        expected = library.step(SamplingParams(temperature=0))
        assert view["attention_layers"] == expected["attention_layers"] == config.attention_layers
        assert view["cache"] == expected["cache"]
    seen = library.inspect(library.current)
    for kind in started["model"]["layer_types"]:
        layer = kind["layer"]
        shown = _post(server, f"/explain/sessions/{key}/attention", {"layer": layer, "head": None}).json()
        assert {k: shown[k] for k in kind} == kind and shown["layers"] == config.num_hidden_layers
        detail = _post(server, f"/explain/sessions/{key}/attention/detail", {"layer": layer, "head": 0, "query": -1})
        if kind["recurrent"]:
            assert shown["weights"] is None and shown["state"]["numbers"] == config.hidden_size * 2
            assert detail.status_code == 400 and detail.json()["error"]["param"] == "layer"
            assert "is a recurrent layer (conv)" in detail.json()["error"]["message"]
        else:
            want = lesson.attention_matrix(seen, layer, None)
            assert torch.tensor(shown["weights"]) == pytest.approx(want, abs=1e-4)
            assert detail.status_code == 200 and detail.json()["layer"] == layer
    bad = _post(server, f"/explain/sessions/{key}/attention", {"layer": config.num_hidden_layers})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "layer"
