"""A windowed cache (KVCache.for_model(..., windowed=True), what generation uses): sliding-window
layers keep only their window's keys (plus a little room), in a buffer whose start moves up as it
fills. Every family with sliding layers gives HF transformers' logits through it at every cached
step far past the window, with its buffer moving many times; its bytes do not grow with the
context; going back within the kept keys works, further back is a one-line StateRollback."""

from __future__ import annotations

import pytest
import torch

from nexttok.generation.prefill import prefill
from nexttok.models import window_keys as cache_module
from nexttok.models.cache import KVCache, StateRollback
from tiny_models import SPECS, VOCAB

ATOL = 1e-4
SLIDING = [name for name, (_, kwargs) in SPECS.items() if kwargs.get("sliding_window")
           and (kwargs.get("layer_types") is None or "sliding_attention" in kwargs["layer_types"])
           and kwargs.get("use_sliding_window", True)]


def _ids(n: int, seed: int = 1, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def small_room(monkeypatch):
    """Room for 2 keys past a window and chunks of 4: the buffer moves every few tokens."""
    monkeypatch.setattr(cache_module, "WINDOW_SLACK", 2)
    monkeypatch.setattr(cache_module, "WINDOW_CHUNK", 4)


def test_the_families_with_sliding_layers_are_all_here():
    assert {"mistral", "qwen2_sliding", "phi3", "gemma3", "olmo3", "exaone4", "smollm3_sliding", "gpt_oss"} <= set(SLIDING)


@pytest.mark.parametrize("name", SLIDING)
@torch.inference_mode()
def test_hfs_logits_far_past_the_window_as_the_buffer_moves(pairs, name, small_room):
    hf, ours, _ = pairs(name)
    ids = _ids(40, seed=2)
    expected = hf(ids).logits
    cache = KVCache.for_model(ours.config, max_len=64, windowed=True)
    assert cache.window_keys and all(g.capacity < 64 for g in cache.window_keys.values())
    torch.testing.assert_close(ours(ids[:, :8], cache), expected[:, :8], atol=ATOL, rtol=0)  # more than the room
    bases = set()
    for t in range(8, 40):
        torch.testing.assert_close(ours(ids[:, t : t + 1], cache)[:, 0], expected[:, t], atol=ATOL, rtol=0)
        bases.add(next(iter(cache.window_keys.values())).base)
    assert len(bases) > 5  # the buffer moved again and again
    chunked = KVCache.for_model(ours.config, max_len=64, windowed=True)
    last = prefill(ours, chunked, ids[0].tolist(), block=9)  # chunks at odd boundaries
    torch.testing.assert_close(last, expected[0, -1], atol=ATOL, rtol=0)


@torch.inference_mode()
def test_a_padded_batch_through_a_moving_buffer_equals_each_row_alone(pairs, small_room):
    _, ours, _ = pairs("gemma3")
    prompts = [_ids(n, seed=10 + n)[0] for n in (5, 11)]
    ids = torch.zeros(2, 11, dtype=torch.long)
    positions = torch.full((2, 11), -1)
    for row, p in enumerate(prompts):
        ids[row, 11 - len(p):], positions[row, 11 - len(p):] = p, torch.arange(len(p))
    cache = KVCache.for_model(ours.config, batch=2, max_len=40, windowed=True)
    ours(ids, cache, positions)
    nexts = _ids(20, seed=99, batch=2)
    together = [ours(nexts[:, i : i + 1], cache, positions[:, -1:] + 1 + i)[:, 0] for i in range(20)]
    for row, p in enumerate(prompts):
        full = torch.cat((p, nexts[row]))
        expected = ours(full[None])[0, len(p):]  # no cache at all
        torch.testing.assert_close(torch.stack([s[row] for s in together]), expected, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_bytes_held_follow_the_layer_types(pairs):
    """gemma3 (2 sliding layers of window 5, 1 full): at 200 of 256 positions the full layer holds the
    whole context, each sliding layer window + WINDOW_SLACK + WINDOW_CHUNK slots, the same as after
    10 tokens."""
    _, ours, _ = pairs("gemma3")
    config = ours.config
    cache = KVCache.for_model(config, max_len=256, windowed=True)
    per_slot = 2 * config.num_key_value_heads * config.head_dim * 4  # keys and values, float32
    ids = _ids(200, seed=3)
    ours(ids[:, :10], cache)
    early = cache.held_bytes()
    prefill(ours, cache, ids[0].tolist(), start=10)
    late = cache.held_bytes()
    room = config.sliding_window + cache_module.WINDOW_SLACK + cache_module.WINDOW_CHUNK
    assert early == late == {"full": 1 * 256 * per_slot, "sliding": 2 * room * per_slot, "recurrent": 0}
    everything = KVCache.for_model(config, max_len=256).held_bytes()
    assert everything == {"full": 3 * 256 * per_slot, "sliding": 0, "recurrent": 0}


@torch.inference_mode()
def test_going_back_within_the_kept_keys_and_past_them(pairs, small_room):
    _, ours, _ = pairs("mistral")
    ids = _ids(30, seed=4)
    cache = KVCache.for_model(ours.config, max_len=40, windowed=True)
    prefill(ours, cache, ids[0].tolist(), block=4)
    base = next(iter(cache.window_keys.values())).base
    window = ours.config.sliding_window
    back = base + window - 1  # the earliest token the kept keys still serve
    cache.truncate(back)
    again = ours(ids[:, back : back + 1], cache)[0, -1]
    torch.testing.assert_close(again, ours(ids[:, : back + 1])[0, -1], atol=ATOL, rtol=0)
    with pytest.raises(StateRollback, match=rf"sliding-window layers keep keys from token {base} on; going back "
                                            rf"to token {back - 1} needs them from {back - window}") as error:
        cache.truncate(back - 1)
    assert "\n" not in str(error.value)
    cache.truncate(0)  # the start is always there
    torch.testing.assert_close(ours(ids, cache)[0, -1], ours(ids)[0, -1], atol=ATOL, rtol=0)
