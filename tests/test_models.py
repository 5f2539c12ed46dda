"""Logits parity with HF transformers on tiny random checkpoints; cache, batching, capture."""

from __future__ import annotations

import pytest
import torch

from nexttok.checkpoints.loading import load_model
from nexttok.models.attention import AttentionCapture
from nexttok.models.cache import ContextFull, KVCache
from tiny_models import SPECS, VOCAB, write_tiny

ATOL = 1e-4


@pytest.fixture(scope="module", params=list(SPECS))
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf = write_tiny(request.param, directory)
    return request.param, hf, load_model(directory)


def _ids(n: int, seed: int = 1, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def test_full_prompt_logits_match_hf(pair):
    _, hf, ours = pair
    ids = _ids(24, batch=2)
    expected = hf(ids).logits
    got = ours(ids)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_every_incremental_step_matches_hf(pair):
    _, hf, ours = pair
    ids = _ids(20, seed=2)
    expected = hf(ids).logits  # (1, 20, V): HF's logits at every position
    cache = KVCache.for_model(ours.config, max_len=32)
    prefill = ours(ids[:, :8], cache)
    torch.testing.assert_close(prefill, expected[:, :8], atol=ATOL, rtol=0)
    for t in range(8, 20):
        step = ours(ids[:, t : t + 1], cache)  # one token, attending to the cache
        torch.testing.assert_close(step[:, 0], expected[:, t], atol=ATOL, rtol=0)
    assert cache.offset == 20


@torch.inference_mode()
def test_hf_incremental_decode_with_its_cache_agrees(pair):
    _, hf, ours = pair
    ids = _ids(12, seed=3)
    out = hf(ids[:, :6], use_cache=True)
    cache = KVCache.for_model(ours.config, max_len=16)
    ours(ids[:, :6], cache)
    past = out.past_key_values
    for t in range(6, 12):
        out = hf(ids[:, t : t + 1], cache=past, use_cache=True)
        past = out.past_key_values
        torch.testing.assert_close(ours(ids[:, t : t + 1], cache)[:, 0], out.logits[:, 0], atol=ATOL, rtol=0)


@torch.inference_mode()
def test_cached_decode_equals_uncached_recompute(pair):
    _, _, ours = pair
    ids = _ids(16, seed=4)
    cache = KVCache.for_model(ours.config, max_len=16)
    ours(ids[:, :1], cache)
    for t in range(1, 16):
        cached = ours(ids[:, t : t + 1], cache)[:, 0]
        full = ours(ids[:, : t + 1])[:, -1]  # no cache: the whole prefix again
        torch.testing.assert_close(cached, full, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_batch_of_different_lengths_equals_each_alone(pair):
    _, _, ours = pair
    prompts = [_ids(n, seed=10 + n)[0] for n in (5, 11, 8)]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(3, width, dtype=torch.long)
    positions = torch.full((3, width), -1)
    for row, p in enumerate(prompts):  # left padding: position -1 marks the pads
        ids[row, width - len(p):] = p
        positions[row, width - len(p):] = torch.arange(len(p))
    cache = KVCache.for_model(ours.config, batch=3, max_len=width + 4)
    logits = ours(ids, cache, positions)
    nexts = _ids(4, seed=99, batch=3)
    steps = [ours(nexts[:, i : i + 1], cache, positions[:, -1:] + 1 + i)[:, 0] for i in range(4)]
    for row, p in enumerate(prompts):
        alone_cache = KVCache.for_model(ours.config, max_len=width + 4)
        alone = ours(p[None], alone_cache)
        torch.testing.assert_close(logits[row, width - len(p):], alone[0], atol=ATOL, rtol=0)
        for i in range(4):
            step = ours(nexts[row : row + 1, i : i + 1], alone_cache)[0, 0]
            torch.testing.assert_close(steps[i][row], step, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_attention_capture_matches_hf(pair, tmp_path):
    name, hf, ours = pair
    ids = _ids(10, seed=5)
    expected = hf(ids, output_attentions=True).attentions  # per layer (B, H, T, S), eager
    capture = AttentionCapture()
    logits = ours(ids, capture=capture)
    captured = capture.last_query
    torch.testing.assert_close(logits, hf(ids).logits, atol=ATOL, rtol=0)
    assert capture.layers == ours.config.attention_layers  # a recurrent layer attends to nothing
    for mine, ref in zip(captured, expected, strict=True):
        assert mine.shape == (1, ours.config.num_attention_heads, 10)
        torch.testing.assert_close(mine, ref[:, :, -1].float(), atol=1e-5, rtol=0)
        if ours.config.attention_sinks:  # each head's sink takes a share of its softmax
            assert ((mine.sum(-1) > 0) & (mine.sum(-1) < 1)).all()
        else:
            torch.testing.assert_close(mine.sum(-1), torch.ones(1, ours.config.num_attention_heads))


@torch.inference_mode()
def test_sliding_window_is_applied(tmp_path):
    hf = write_tiny("mistral", tmp_path)
    ours = load_model(tmp_path)
    ids = _ids(20, seed=6)
    torch.testing.assert_close(ours(ids), hf(ids).logits, atol=ATOL, rtol=0)
    window = ours.config.sliding_window
    capture = AttentionCapture()
    ours(ids, capture=capture)
    captured = capture.last_query
    assert (captured[0][..., : 20 - window] == 0).all()  # keys before the window get no weight
    assert (captured[0][..., 20 - window :] > 0).all()


@torch.inference_mode()
def test_bfloat16_on_request(tmp_path):
    hf = write_tiny("llama_gqa_llama3_rope", tmp_path)
    ours = load_model(tmp_path, dtype="bfloat16")
    assert ours.embed_tokens.weight.dtype == torch.bfloat16
    ids = _ids(12, seed=7)
    got = ours(ids).float()
    expected = hf(ids).logits
    assert (got - expected).abs().max() < 0.1 * expected.abs().max()


@torch.inference_mode()
def test_cache_limits_truncate_and_reset(tmp_path):
    write_tiny("gpt2", tmp_path)
    ours = load_model(tmp_path)
    ids = _ids(10, seed=8)
    cache = KVCache.for_model(ours.config, max_len=8)
    with pytest.raises(ContextFull, match="context window full: 0 cached \\+ 10 new tokens > 8"):
        ours(ids, cache)
    cache.reset()
    first = ours(ids[:, :6], cache)
    branch = ours(ids[:, 6:7], cache)
    cache.truncate(6)  # forget the last token, take another branch, come back
    ours(ids[:, 7:8], cache)
    cache.truncate(6)
    again = ours(ids[:, 6:7], cache)
    torch.testing.assert_close(again, branch)
    cache.reset()
    torch.testing.assert_close(ours(ids[:, :6], cache), first)
    with pytest.raises(ValueError, match="truncate length must be in 0..6"):
        cache.truncate(7)
    with pytest.raises(ValueError, match="exceed the model's context of 128"):
        ours(_ids(129, seed=9))
