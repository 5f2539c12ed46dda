"""The lesson's numbers are the model's: attention matrices and residual streams equal HF transformers'
(output_attentions / output_hidden_states), the lens at the last layer is the model's logits,
neighbours are a torch cosine top-k, positions are the model's own table or RoPE rotation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nexttok.checkpoints.loading import load_model
from nexttok.errors import InvalidParameter
from nexttok.lesson import sections as lesson
from tiny_models import write_tiny, write_tiny_with_gpt2_tokenizer

IDS = [3, 17, 5, 99, 42, 7, 7, 64, 1, 30, 11]


def _pair(name, tmp_path_factory):
    directory = tmp_path_factory.mktemp(name)
    hf = write_tiny(name, directory)
    return load_model(directory), hf


@pytest.fixture(scope="module", params=["gpt2", "llama_gqa_llama3_rope", "qwen2_sliding"])
def pair(request, tmp_path_factory):
    return _pair(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=["llama_gqa_llama3_rope", "qwen2_sliding", "qwen3"])
def rope_pair(request, tmp_path_factory):
    return _pair(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def worded(tmp_path_factory, gpt2_dir):
    """A tiny Llama over the real GPT-2 vocabulary (so words are words), with its HF twin."""
    directory = tmp_path_factory.mktemp("worded")
    hf = write_tiny_with_gpt2_tokenizer("llama_gqa_llama3_rope", directory, gpt2_dir)
    return load_model(directory), hf


def test_attention_weights_and_residual_stream_equal_hf(pair):
    model, hf = pair
    seen = lesson.inspect(model, IDS)
    with torch.no_grad():
        ref = hf(torch.tensor([IDS]), output_attentions=True, output_hidden_states=True)
    assert seen.weights.shape == (model.config.num_hidden_layers, model.config.num_attention_heads, 11, 11)
    for layer, weights in enumerate(ref.attentions):
        torch.testing.assert_close(seen.weights[layer], weights[0], atol=1e-5, rtol=1e-4)
    # HF's last hidden state is after the final norm; every earlier one is the raw residual stream
    for ours, theirs in zip(seen.hidden[:-1], ref.hidden_states[:-1], strict=True):
        torch.testing.assert_close(ours.float(), theirs[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(seen.logits, ref.logits[0], atol=1e-4, rtol=1e-4)


def test_lens_last_layer_is_the_models_prediction(pair, gpt2):
    model, hf = pair
    seen = lesson.inspect(model, IDS)
    view = lesson.lens(model, gpt2, seen, position=-1, top=5)
    assert len(view["layers"]) == model.config.num_hidden_layers + 1
    last = view["layers"][-1]
    probs = seen.logits[-1].softmax(-1)
    assert [row["id"] for row in last["top"]] == torch.topk(probs, 5).indices.tolist()
    assert last["top"][0]["p"] == pytest.approx(float(probs.max()), rel=1e-5)
    assert view["final"]["id"] == int(probs.argmax()) and last["final_rank"] == 1
    # an earlier layer: its own lens, computed here from HF's residual stream and HF's norm + head
    with torch.no_grad():
        ref = hf(torch.tensor([IDS]), output_hidden_states=True)
        norm = hf.transformer.ln_f if hasattr(hf, "transformer") else hf.model.norm
        early = hf.lm_head(norm(ref.hidden_states[1][0, -1])).softmax(-1)
    assert view["layers"][1]["top"][0]["id"] == int(early.argmax())
    assert view["layers"][1]["final_p"] == pytest.approx(float(early[view["final"]["id"]]), rel=1e-3)


def test_attention_detail_is_the_models_weights_by_hand(pair):
    model, _ = pair
    seen = lesson.inspect(model, IDS)
    for layer, head, query in [(0, 0, 0), (1, 3, 10), (1, 2, 6)]:
        detail = lesson.attention_detail(seen, layer, head, query)
        first = detail["first"]
        assert detail["keys"].shape == (query + 1 - first, model.config.head_dim)
        assert float(seen.weights[layer, head, query, :first].sum()) == 0  # outside the window: nothing
        torch.testing.assert_close(detail["weights"], detail["model_weights"], atol=1e-6, rtol=1e-5)
        q, k, v = (t[layer][head : head + 1, first : query + 1] for t in (seen.q, seen.k, seen.v))
        expected = F.scaled_dot_product_attention(q[:, -1:], k, v)[0, -1]
        torch.testing.assert_close(detail["output"], expected, atol=1e-5, rtol=1e-4)
    with pytest.raises(InvalidParameter, match="layer must be in 0..1"):
        lesson.attention_detail(seen, 2, 0, 0)
    with pytest.raises(InvalidParameter, match="query must be in 0..10"):
        lesson.attention_detail(seen, 0, 0, 11)


def test_mean_attention_matrix_and_errors(pair):
    model, hf = pair
    seen = lesson.inspect(model, IDS)
    mean = lesson.attention_matrix(seen, 1, None)
    with torch.no_grad():  # the reference: HF's own weights of layer 1, averaged over its heads here
        heads = hf(torch.tensor([IDS]), output_attentions=True).attentions[1][0].double()
    torch.testing.assert_close(mean.double(), sum(heads[h] for h in range(len(heads))) / len(heads),
                               atol=1e-5, rtol=1e-4)
    assert torch.allclose(mean.sum(-1), torch.ones(len(IDS)), atol=1e-5)
    assert float(mean.triu(1).abs().max()) == 0  # no query sees a later key
    with pytest.raises(InvalidParameter, match="head must be in 0..3"):
        lesson.attention_matrix(seen, 0, 4)
    with pytest.raises(InvalidParameter, match="1 to 256 tokens"):
        lesson.inspect(model, [1] * 257)


def test_neighbours_are_a_cosine_top_k_of_the_embedding_matrix(worded, gpt2):
    model, hf = worded
    ids, vector = lesson.word_vector(model, gpt2, "king")
    assert ids == gpt2.encode(" king") and len(ids) == 1
    table = hf.model.embed_tokens.weight.detach()
    torch.testing.assert_close(vector, table[ids[0]])
    found = lesson.neighbors(model, vector, 10, exclude=ids)
    similarity = F.normalize(table, dim=-1) @ F.normalize(table[ids[0]], dim=-1)
    similarity[ids] = -2
    expected = torch.topk(similarity, 10)
    assert [i for i, _ in found] == expected.indices.tolist()
    assert [c for _, c in found] == pytest.approx(expected.values.tolist(), abs=1e-5)
    several, mean = lesson.word_vector(model, gpt2, "antidisestablishmentarianism")
    assert several == gpt2.encode(" antidisestablishmentarianism") and len(several) > 1
    rows = [hf.model.embed_tokens(torch.tensor(i)).detach().double() for i in several]  # HF's rows, one by one
    torch.testing.assert_close(mean.double(), sum(rows) / len(rows), atol=1e-6, rtol=1e-5)


def test_pca_map_matches_numpy(worded, gpt2):
    model, _ = worded
    words = ["king", "queen", "apple", "banana", "car", "road"]
    vectors = torch.stack([lesson.word_vector(model, gpt2, w)[1] for w in words])
    coords, share = lesson.pca_map(vectors)
    centered = vectors.numpy() - vectors.numpy().mean(0)
    u, s, vt = np.linalg.svd(centered, full_matrices=False)
    for c in range(2):
        np.testing.assert_allclose(np.abs(coords[:, c].numpy()), np.abs(centered @ vt[c]), atol=1e-4)
    assert share == pytest.approx((s[:2] ** 2 / (s**2).sum()).tolist(), rel=1e-4)
    cosines = lesson.cosine_matrix(vectors)
    assert float(cosines[0, 1]) == pytest.approx(
        float(np.dot(vectors[0], vectors[1]) / np.linalg.norm(vectors[0]) / np.linalg.norm(vectors[1])), abs=1e-5)


def test_learned_positions_are_the_models_table(tmp_path_factory):
    model, hf = _pair("gpt2", tmp_path_factory)
    view = lesson.positions(model, 16, 64)
    table = hf.transformer.wpe.weight.detach()[:16]
    assert view["kind"] == "learned"
    torch.testing.assert_close(view["similarity"], F.normalize(table, dim=-1) @ F.normalize(table, dim=-1).T)


def test_rope_angles_and_distance_score_equal_hf_rotation(rope_pair):
    model, hf = rope_pair
    view = lesson.positions(model, 16, 40)
    assert view["kind"] == "rope"
    hd = model.config.rotary_dim
    positions = torch.arange(41)[None]
    cos, sin = hf.model.rotary_emb(torch.zeros(1, 41, hd), positions)  # HF: (1, P, hd), halves repeated
    torch.testing.assert_close(torch.cos(view["angles"]).float(), cos[0, :16, : hd // 2], atol=1e-5, rtol=1e-5)
    ones = torch.ones(hd)
    rotated = ones * cos[0] + torch.cat([-ones[hd // 2 :], ones[: hd // 2]]) * sin[0]  # HF's rotate_half rule
    scores = rotated @ rotated[0] / hd  # a key at position 0, the query d positions later
    torch.testing.assert_close(view["score"].float(), scores, atol=1e-5, rtol=1e-5)


def test_small_helpers():
    assert lesson.cost(1500, 2.0) == pytest.approx(0.003)
