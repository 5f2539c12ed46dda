"""The server's SlotCache keeps a sliding-window layer's last keys only, per slot (window_keys.SlotWindows):
its bytes do not grow with the context on those layers; rows decoded together far past the window
give HF's logits and each one's own bits alone; the scheduler serves concurrent requests longer than
the window with generate()'s greedy tokens; the prefix cache reuses blocks the window layers no
longer hold (kept as each chunk is prefilled), bit for bit as without it."""

from __future__ import annotations

import asyncio

import pytest
import torch

from nexttok.checkpoints.loading import load_model
from nexttok.generation.loop import Generation, generate
from nexttok.generation.sampling import SamplingParams
from nexttok.models import window_keys
from nexttok.models.compiled import CompileUnavailable, compile_decode
from nexttok.models.slot_cache import SlotCache
from nexttok.server.metrics import Metrics
from nexttok.server.prefix_cache import PrefixCache, prefill
from nexttok.server.scheduler import Scheduler
from tiny_models import VOCAB, write_tiny

ATOL = 1e-4
GREEDY = SamplingParams(temperature=0)
SLIDING = ["mistral", "gemma3", "gpt_oss", "olmo3", "gemma4"]  # every layer / local+global / sinks / shared KV
# rows that differ alone and in a batch in the last bits with every key kept too (as on main): gpt-oss's
# experts take the batch's tokens together; one of Gemma 4's rows here
NOT_BITWISE = {"gpt_oss", "gemma4"}


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture
def small_room(monkeypatch):
    """Room for 2 keys past a window and chunks of 4: every slot's buffer moves every few tokens."""
    monkeypatch.setattr(window_keys, "WINDOW_SLACK", 2)
    monkeypatch.setattr(window_keys, "WINDOW_CHUNK", 4)


def _decode(model, prompts: list[list[int]], steps: int, cache: SlotCache, block: int = 8) -> list[torch.Tensor]:
    """Each prompt prefilled into its slot (in chunks of block, as the server's), then `steps` greedy
    decode steps of all together (scratch rows up to the slots): every row's logits (steps + 1, vocab)."""
    out = [[prefill(model, cache, cache.claim(), p, None, block=block)] for p in prompts]
    for _ in range(steps):
        view = cache.running_view(cache.slots)
        rows = [min(r, len(prompts) - 1) for r in range(view.n)]
        ids = torch.tensor([[int(out[r][-1].argmax())] for r in rows])
        positions = torch.tensor([[cache.lengths[r]] for r in rows])
        logits = model(ids, view, positions, last_only=True)[:, -1]
        view.release_scratch()
        for r in range(len(prompts)):
            out[r].append(logits[r])
    return [torch.stack(rows) for rows in out]


@pytest.mark.parametrize("name", SLIDING)
@torch.inference_mode()
def test_rows_far_past_the_window_give_hfs_logits_and_their_own_bits(pairs, name, small_room):
    hf, ours, _ = pairs(name)
    prompts = [_ids(n, seed=n) for n in (23, 3, 14)]
    cache = SlotCache.for_model(ours.config, slots=3, max_len=64)
    assert cache.window_keys and all(w.capacity < 64 for w in cache.window_keys.values())
    together = _decode(ours, prompts, 30, cache)
    assert any(w.base[0] > 0 for w in cache.window_keys.values())  # the buffers moved
    for p, logits in zip(prompts, together, strict=True):
        seq = p + [int(x.argmax()) for x in logits[:-1]]
        torch.testing.assert_close(logits, hf(torch.tensor([seq])).logits[0, len(p) - 1 :], atol=ATOL, rtol=0)
        alone = _decode(ours, [p], 30, SlotCache.for_model(ours.config, slots=3, max_len=64))[0]
        if name in NOT_BITWISE:
            torch.testing.assert_close(alone, logits, atol=ATOL, rtol=0)
        else:
            assert torch.equal(alone, logits)


@torch.inference_mode()
def test_the_compiled_decode_step_reads_the_windows_too(tmp_path, small_room):
    """Attention stays outside the compiled graph (an opaque op over the real cache): steps over
    windows that move give HF's logits, compiled for the slots' 3 rows."""
    hf = write_tiny("mistral", tmp_path)
    ours = load_model(tmp_path)
    try:
        compile_decode(ours)
    except CompileUnavailable as e:
        pytest.skip(str(e))
    prompts = [_ids(n, seed=n) for n in (23, 3, 14)]
    for p, logits in zip(prompts, _decode(ours, prompts, 30, SlotCache.for_model(ours.config, 3, 64)), strict=True):
        seq = p + [int(x.argmax()) for x in logits[:-1]]
        torch.testing.assert_close(logits, hf(torch.tensor([seq])).logits[0, len(p) - 1 :], atol=ATOL, rtol=0)
    assert ours.compiled.compiled_rows == {3}


@torch.inference_mode()
def test_a_freed_slot_starts_its_window_again(pairs, small_room):
    """Releasing the last running slot (no move) or another (the last moves in): the freed slot's window
    buffer starts at position 0 again, so a scratch row there reads its own key only."""
    _, ours, _ = pairs("mistral")
    cache = SlotCache.for_model(ours.config, slots=3, max_len=64)
    for n in (30, 20):
        prefill(ours, cache, cache.claim(), _ids(n, seed=n), None, block=8)
    (w,) = cache.window_keys.values()
    assert w.base[0] > 0 and w.base[1] > 0
    assert cache.release(1) is None and w.base[1] == 0
    prefill(ours, cache, cache.claim(), _ids(25, seed=5), None, block=8)
    assert cache.release(0) == 1 and w.base[1] == 0 and w.base[0] > 0
    view = cache.running_view(3)
    ours(torch.tensor([[1], [1], [1]]), view, torch.tensor([[cache.lengths[0]]] * 3), last_only=True)
    assert view.window_spans(ours.config.sliding_window)[1:] == ((0, 1), (0, 1))
    view.release_scratch()


@torch.inference_mode()
def test_held_bytes_bounded_on_window_layers(pairs):
    """gemma3 (2 sliding layers of window 5, 1 full), 3 slots of 256 positions, each at 220: the full
    layer holds every position of every slot, each sliding layer window + WINDOW_SLACK + WINDOW_CHUNK
    per slot, as before the first token; a cache keeping every key holds 256 on all three."""
    _, ours, _ = pairs("gemma3")
    config = ours.config
    cache = SlotCache.for_model(config, slots=3, max_len=256)
    per_position = 2 * config.num_key_value_heads * config.head_dim * 4  # keys and values, float32
    room = config.sliding_window + window_keys.WINDOW_SLACK + window_keys.WINDOW_CHUNK
    empty = cache.held_bytes()
    assert empty == {"full": 1 * 3 * 256 * per_position, "sliding": 2 * 3 * room * per_position, "recurrent": 0}
    _decode(ours, [_ids(200, seed=s) for s in (1, 2, 3)], 20, cache, block=128)
    assert min(cache.lengths[:3]) == 220 and cache.held_bytes() == empty
    everything = SlotCache.for_model(config, slots=3, max_len=256, windowed=False).held_bytes()
    assert everything == {"full": 3 * 3 * 256 * per_position, "sliding": 0, "recurrent": 0}


B = 32  # prefix blocks; with small_room a window layer keeps fewer positions than two blocks


@pytest.mark.parametrize("name", ["mistral", "gemma3", "gemma4"])
@torch.inference_mode()
def test_a_prefix_past_the_window_is_reused_bit_for_bit(pairs, name, small_room):
    """The first prompt's blocks are kept as its chunks are prefilled (by its end a window layer holds
    its last few positions only); the second prompt reuses 3 of them, loading the window layers'
    last ones: its logits, and every key the slot holds, equal a prefill without the cache."""
    _, ours, _ = pairs(name)
    first = _ids(100, seed=0)
    second = first + _ids(25, seed=1)
    cache = SlotCache.for_model(ours.config, slots=3, max_len=160)
    prefix = PrefixCache(cache, 32 * B, Metrics(), block=B)
    slot = cache.claim()
    prefill(ours, cache, slot, first, prefix, block=B)
    assert cache.kept_from(slot) > B and prefix.tokens == 3 * B  # gone from the slot, kept in the pool
    hit, fresh = cache.claim(), cache.claim()
    with_cache = prefill(ours, cache, hit, second, prefix, block=B)
    without = prefill(ours, cache, fresh, second, None, block=B)
    assert prefix.metrics.value("prefix_cache_reused_tokens_total") == 3 * B
    assert torch.equal(with_cache, without)
    start, n = cache.kept_from(hit), len(second)
    assert start == cache.kept_from(fresh) > 0
    for (k, v), (k_fresh, v_fresh) in zip(cache.keys_values(hit, start, n), cache.keys_values(fresh, start, n),
                                          strict=True):
        assert torch.equal(k, k_fresh) and torch.equal(v, v_fresh)


def _serve(model, tokenizer, prompts, budgets, delays, **options) -> tuple[list[list[int]], Scheduler]:
    scheduler = Scheduler(model, max_running=3, max_len=256, **options)
    scheduler.start()

    async def run(prompt, budget, delay):
        await asyncio.sleep(delay)
        generation = Generation(model.config, tokenizer, prompt, GREEDY, max_tokens=budget, stop_token_ids=[])
        return [step.token_id async for step in scheduler.submit(generation)]

    async def main():
        return await asyncio.gather(*(run(*job) for job in zip(prompts, budgets, delays, strict=True)))

    try:
        return asyncio.run(main()), scheduler
    finally:
        scheduler.stop()


@pytest.mark.parametrize("name", ["mistral", "gemma3", "gpt_oss"])
def test_served_requests_longer_than_the_window_get_generates_tokens(checkpoints, name):
    """Three requests at once, two of them longer than a window layer's whole buffer (5 + 32 + 128):
    each gets generate()'s greedy tokens (HF-exact), with the prefix cache or without; the third,
    arriving once the first's blocks are in, reuses its first block (which the first's window layers
    dropped during its prefill)."""
    checkpoint = checkpoints(name)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    shared = _ids(190, seed=20)
    prompts = [shared + _ids(6, seed=21), _ids(9, seed=22), shared + _ids(20, seed=23)]
    budgets, delays = [24, 30, 20], [0, 0, 1.0]
    alone = [generate(model, tokenizer, p, GREEDY, max_tokens=n, stop_token_ids=[]).token_ids
             for p, n in zip(prompts, budgets, strict=True)]
    served, _ = _serve(model, tokenizer, prompts, budgets, delays)
    assert served == alone
    reused, scheduler = _serve(model, tokenizer, prompts, budgets, delays, prefix_cache_tokens=512)
    assert reused == alone
    assert scheduler.metrics.value("prefix_cache_reused_tokens_total") == 128
    assert scheduler.cache.held_bytes()["sliding"] == SlotCache.for_model(model.config, 3, 256).held_bytes()["sliding"]
