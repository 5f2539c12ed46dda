"""The server's prefix cache on hybrid models (LFM2's short convolutions, Qwen3.5's gated DeltaNet):
a block keeps a checkpoint of every recurrent state at its end, a later prompt resumes at the last
matched block that has one, and nothing it generates changes (logits and states bit for bit as a
cold prefill, greedy tokens as a cold server and generate()); checkpoints count against the
capacity and go with their blocks; resuming without one is refused in one line."""

from __future__ import annotations

import asyncio

import pytest
import torch

from nexttok.generation.loop import Generation, generate
from nexttok.generation.sampling import SamplingParams
from nexttok.models.cache import StateRollback
from nexttok.models.slot_cache import SlotCache
from nexttok.server.metrics import Metrics
from nexttok.server.prefix_cache import PrefixCache, prefill
from nexttok.server.scheduler import Scheduler
from tiny_models import VOCAB

HYBRIDS = ["lfm2", "qwen3_5"]
ATOL = 1e-4
B = 32  # blocks small enough for the tiny models' contexts; the server's is BLOCK
GREEDY = SamplingParams(temperature=0)


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _setup(model, capacity_tokens: int = 32 * B, slots: int = 3):
    cache = SlotCache.for_model(model.config, slots=slots, max_len=256)
    return cache, PrefixCache(cache, capacity_tokens, Metrics(), block=B)


@torch.inference_mode()
def _run(model, cache, ids, prefix):
    """Prefill ids into a fresh slot, cut at multiples of B: (its slot, logits)."""
    slot = cache.claim()
    return slot, prefill(model, cache, slot, ids, prefix, block=B)


def _same_slot(cache, a: int, b: int, n: int) -> None:
    """Slots a and b hold the same bits: every key and value of n tokens, every recurrent state."""
    for (k, v), (k2, v2) in zip(cache.keys_values(a, 0, n), cache.keys_values(b, 0, n), strict=True):
        assert torch.equal(k, k2) and torch.equal(v, v2)
    states, fresh = cache.states_of(a), cache.states_of(b)
    assert states.keys() == fresh.keys() and all(torch.equal(states[k], fresh[k]) for k in states)


def _checkpoint_tokens(model) -> int:
    cache, prefix = _setup(model)
    _run(model, cache, _ids(B, 0), prefix)
    return prefix.checkpoint_tokens(cache)


@pytest.mark.parametrize("name", HYBRIDS)
def test_a_checkpoint_counts_as_the_tokens_of_as_many_bytes(pairs, name):
    """Every recurrent layer's states of one slot (float32 on the CPU), over the bytes one token's
    keys and values take in the attention layers, rounded up."""
    _, ours, _ = pairs(name)
    c = ours.config
    past = c.conv_kernel - 1
    if name == "lfm2":  # the convolution's last inputs
        per_layer = c.hidden_size * past * 4
    else:  # the DeltaNet's convolution over q, k, v and its state per value head
        conv_dim = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
        per_layer = conv_dim * past * 4 + c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
    state_bytes = len(c.recurrent_layers) * per_layer
    token_bytes = len(c.attention_layers) * 2 * c.num_key_value_heads * c.head_dim * 4
    assert _checkpoint_tokens(ours) == -(-state_bytes // token_bytes)
    assert (state_bytes, token_bytes) == {"lfm2": (1536, 256), "qwen3_5": (9600, 256)}[name]


@pytest.mark.parametrize("name", HYBRIDS)
def test_a_reused_prefix_resumes_from_its_checkpoint_bit_for_bit(pairs, name):
    """Each chunk of the first prompt ends a block, so each block keeps the states there; the second
    prompt reuses 3 blocks and their last checkpoint: its logits, keys and states equal a cold
    prefill's, and HF's logits."""
    hf, ours, _ = pairs(name)
    first = _ids(100, seed=0)  # 3 whole blocks
    second = first + _ids(25, seed=1)
    cache, prefix = _setup(ours)
    _run(ours, cache, first, prefix)
    assert prefix.tokens == 3 * B and prefix.checkpoints == 3
    hit, with_cache = _run(ours, cache, second, prefix)
    fresh, without = _run(ours, cache, second, None)
    assert prefix.metrics.value("prefix_cache_reused_tokens_total") == 3 * B
    assert prefix.metrics.value("prefix_cache_hits_total") == 1
    assert torch.equal(with_cache, without)
    _same_slot(cache, hit, fresh, len(second))
    with torch.inference_mode():
        torch.testing.assert_close(with_cache, hf(torch.tensor([second])).logits[0, -1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", HYBRIDS)
def test_a_prefix_ending_mid_block_resumes_at_the_block_before(pairs, name):
    """Shared up to token 80, in the third block: the first two blocks and the states after token 64."""
    _, ours, _ = pairs(name)
    first = _ids(100, seed=2)
    second = first[:80] + _ids(30, seed=3)
    cache, prefix = _setup(ours)
    _run(ours, cache, first, prefix)
    assert len(prefix.match(second)) == 2
    hit, with_cache = _run(ours, cache, second, prefix)
    fresh, without = _run(ours, cache, second, None)
    assert prefix.metrics.value("prefix_cache_reused_tokens_total") == 2 * B
    assert torch.equal(with_cache, without)
    _same_slot(cache, hit, fresh, len(second))


@pytest.mark.parametrize("name", HYBRIDS)
def test_evicted_blocks_take_their_checkpoints_along(pairs, name):
    """Room for 3 blocks with their checkpoints: as test_prefix_cache's eviction test, the least
    recently used leaf goes with its checkpoint; what is served again is still exact."""
    _, ours, _ = pairs(name)
    ck = _checkpoint_tokens(ours)
    cache, prefix = _setup(ours, capacity_tokens=3 * (B + ck) + B - 1, slots=8)  # no room for a 4th
    a, b = _ids(2 * B + 1, 8), _ids(2 * B + 1, 9)
    _run(ours, cache, a, prefix)  # a1 <- a2
    _run(ours, cache, b, prefix)  # b1 <- b2: a2 goes, and its checkpoint
    metrics = prefix.metrics
    assert (prefix.tokens, prefix.checkpoints) == (3 * B, 3)
    assert metrics.value("prefix_cache_evicted_tokens_total") == B
    assert metrics.value("prefix_cache_checkpoint_tokens") == 3 * ck
    assert [len(prefix.match(p)) for p in (a, b)] == [1, 2]
    slot, again = _run(ours, cache, a, prefix)  # resumes after a1, keeps a2 and its states again: b2 goes
    assert metrics.value("prefix_cache_evicted_tokens_total") == 2 * B
    assert [len(prefix.match(p)) for p in (a, b)] == [2, 1]
    assert (prefix.tokens, prefix.checkpoints) == (3 * B, 3)
    assert metrics.value("prefix_cache_tokens") + metrics.value("prefix_cache_checkpoint_tokens") <= 3 * (B + ck) + B
    fresh, cold = _run(ours, cache, a, None)
    assert torch.equal(again, cold)
    _same_slot(cache, slot, fresh, len(a))


@pytest.mark.parametrize("name", HYBRIDS)
def test_a_chain_filling_the_pool_drops_inner_checkpoints_and_resumes_before(pairs, name):
    """Room for 6 blocks' keys and 3 checkpoints or more: one prompt of 6 blocks keeps every block,
    and checkpoints as it goes, dropping inner ones (their keys stay) for the newest. A prompt that
    leaves it inside the 5th block resumes at the last of its blocks that kept one, and is exact."""
    _, ours, _ = pairs(name)
    ck = _checkpoint_tokens(ours)
    budget = (6 * B + 3 * ck + B - 1) // B * B
    cache, prefix = _setup(ours, capacity_tokens=budget, slots=4)
    first = _ids(6 * B + 5, seed=10)
    _run(ours, cache, first, prefix)
    chain = prefix.match(first)
    assert len(chain) == 6 and prefix.tokens == 6 * B  # every block, the last with its checkpoint
    assert 1 <= prefix.checkpoints < 6 and prefix.held <= budget
    second = first[: 4 * B + 3] + _ids(20, seed=11)
    resume = max(i + 1 for i, block in enumerate(chain[:4]) if block.states is not None)
    assert 0 < resume < 4  # the 4th block's checkpoint was dropped, an earlier one kept
    assert len(prefix.match(second)) == resume
    hit, with_cache = _run(ours, cache, second, prefix)
    fresh, without = _run(ours, cache, second, None)
    assert prefix.metrics.value("prefix_cache_reused_tokens_total") == resume * B
    assert torch.equal(with_cache, without)
    _same_slot(cache, hit, fresh, len(second))


def test_resuming_a_recurrent_model_without_a_checkpoint_refuses_in_one_line(pairs):
    _, ours, _ = pairs("qwen3_5")
    cache = SlotCache.for_model(ours.config, slots=2, max_len=64)
    keys = [(torch.zeros(1, 1, 3, 32), torch.zeros(1, 1, 3, 32))]
    with pytest.raises(StateRollback, match="cannot start from stored keys and values alone") as error:
        cache.load(0, keys)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"a checkpoint of recurrent states lacks \[0, 1, 2\]"):
        cache.load(0, keys, states={})


def _serve(model, tokenizer, prompts, max_tokens: int, **options) -> tuple[list[list], Scheduler]:
    """Each prompt through one scheduler, one after the other: every step's (token, logprob, top 5)."""
    scheduler = Scheduler(model, max_running=3, max_len=256, **options)
    scheduler.start()

    async def run(prompt):
        generation = Generation(model.config, tokenizer, prompt, GREEDY, max_tokens=max_tokens, stop_token_ids=[])
        return [(s.token_id, s.logprob, [(a.id, a.logprob) for a in s.top]) async for s in scheduler.submit(generation)]

    try:
        return [asyncio.run(run(p)) for p in prompts], scheduler
    finally:
        scheduler.stop()


@pytest.mark.parametrize("name", HYBRIDS)
def test_served_requests_sharing_a_prefix_get_a_cold_servers_steps(checkpoints, name):
    """Two requests sharing 150 tokens (a whole BLOCK) through the scheduler with its prefix cache:
    the second reports the hit, and every step (token, logprob, top alternatives) equals a server
    without the cache, bit for bit, and generate()'s (its tokens; logprobs within float error)."""
    checkpoint = checkpoints(name)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    shared = _ids(150, seed=20)
    prompts = [shared + _ids(6, seed=21), shared + _ids(20, seed=22)]
    cold, _ = _serve(model, tokenizer, prompts, 16)
    warm, scheduler = _serve(model, tokenizer, prompts, 16, prefix_cache_tokens=1024)
    assert warm == cold
    metrics = scheduler.metrics
    assert metrics.value("prefix_cache_hits_total") == 1 and metrics.value("prefix_cache_reused_tokens_total") == 128
    assert metrics.value("prefix_cache_checkpoints") == 1  # the shared block's (the prompts' only whole one)
    for prompt, steps in zip(prompts, warm, strict=True):
        alone = generate(model, tokenizer, prompt, GREEDY, max_tokens=16, stop_token_ids=[]).steps
        assert [s[0] for s in steps] == [s.token_id for s in alone]
        torch.testing.assert_close(torch.tensor([s[1] for s in steps]), torch.tensor([s.logprob for s in alone]),
                                   atol=ATOL, rtol=0)
