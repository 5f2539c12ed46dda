"""Gemma 4 past what tests/test_models.py checks for every SPECS entry (HF's logits for whole prompts
and every cached step, padded batches against each row alone, attention weights): a padded batch
against HF's own padded batch at every cached step, KV-shared layers that write no cache, the
server's paths (SlotCache rows, the scheduler with its prefix cache, speculative decoding's
truncation) giving the tokens of plain decoding, the multimodal checkpoint's text part, the hub's
config spelling, the router, the explainer's inspection, and one-line refusals."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from nexttok.checkpoints.loading import load_checkpoint, load_model
from nexttok.generation.loop import Generation, generate
from nexttok.generation.sampling import SamplingParams
from nexttok.generation.speculative import NgramDrafter, Rounds, speculative_stream
from nexttok.lesson import sections as lesson
from nexttok.models.attention import AttentionCapture
from nexttok.models.cache import KVCache
from nexttok.models.compiled import CompileUnavailable, compile_decode
from nexttok.models.config import ConfigError
from nexttok.models.registry import from_hf_config, read_config
from nexttok.parallel.layers import check_world
from nexttok.server.scheduler import Scheduler
from tiny_models import SPECS, VOCAB, write_tiny, write_tiny_gemma4_multimodal, write_tiny_tokenizer

ATOL = 1e-4
GEMMA4 = ["gemma4", "gemma4_k_eq_v", "gemma4_moe"]
GREEDY = SamplingParams(temperature=0)


def _ids(n: int, seed: int = 1, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", GEMMA4)
@torch.inference_mode()
def test_padded_batch_matches_hf_at_every_cached_step(pairs, name):
    """Two prompts longer than the window, left-padded into one batch, then six decode steps: every
    real position's logits are HF's, run on the same padded batch with its attention mask and cache."""
    hf, ours, _ = pairs(name)
    lengths, width, steps = (14, 9), 14, 6
    ids = torch.zeros(2, width, dtype=torch.long)
    positions = torch.full((2, width), -1)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = _ids(n, seed=30 + n)[0]
        positions[row, width - n :] = torch.arange(n)
    mask = (positions >= 0).long()
    out = hf(ids, attention_mask=mask, position_ids=positions.clamp(min=0), use_cache=True)
    cache = KVCache.for_model(ours.config, batch=2, max_len=width + steps)
    got = ours(ids, cache, positions)
    for row, n in enumerate(lengths):
        torch.testing.assert_close(got[row, width - n :], out.logits[row, width - n :], atol=ATOL, rtol=0)
    nexts = _ids(steps, seed=77, batch=2)
    for i in range(steps):
        step_pos = torch.tensor([[n + i] for n in lengths])
        mask = torch.cat((mask, torch.ones(2, 1, dtype=torch.long)), dim=1)
        out = hf(nexts[:, i : i + 1], attention_mask=mask, position_ids=step_pos, cache=out.past_key_values,
                 use_cache=True)
        torch.testing.assert_close(ours(nexts[:, i : i + 1], cache, step_pos)[:, 0], out.logits[:, 0], atol=ATOL,
                                   rtol=0)


@torch.inference_mode()
def test_kv_shared_layers_borrow_and_write_no_cache(pairs):
    """The last two layers (a sliding and a full one) store nothing: the cache holds no room for
    them, they never write, and each attends over its source layer's keys, cached ones included."""
    hf, ours, _ = pairs("gemma4")
    config = ours.config
    assert [config.kv_source(i) for i in range(5)] == [0, 1, 2, 2, 1]
    cache = KVCache.for_model(config, max_len=24)
    assert cache.shapes == [(2, 16), (2, 32), (2, 16), None, None] and not cache.uniform
    assert [tuple(k.shape) for k, _ in cache.groups] == [(2, 1, 2, 24, 16), (1, 1, 2, 24, 32)]
    assert cache.slots_of[3] is None and cache.slots_of[4] is None
    written = []
    store = cache.update_and_fetch
    cache.update_and_fetch = lambda layer, k, v: written.append(layer) or store(layer, k, v)
    ids = _ids(20, seed=3)
    expected = hf(ids).logits
    capture = AttentionCapture()
    torch.testing.assert_close(ours(ids[:, :12], cache, capture=capture), expected[:, :12], atol=ATOL, rtol=0)
    for t in range(12, 20):
        torch.testing.assert_close(ours(ids[:, t : t + 1], cache)[:, 0], expected[:, t], atol=ATOL, rtol=0)
    assert set(written) == {0, 1, 2}
    # the borrowing layers see what their sources see: a window of 5 for the sliding one, all for the full one
    assert (capture.last_query[3][..., :7] == 0).all() and (capture.last_query[3][..., 7:] > 0).all()
    assert (capture.last_query[4] > 0).all()
    with pytest.raises(ValueError, match="several shapes"):
        cache.k  # noqa: B018


@torch.inference_mode()
def test_truncate_and_speculative_decoding_give_plain_decodings_tokens(tmp_path):
    """Speculative decoding verifies k drafted tokens in one pass and truncates the cache where a
    draft is refused; the borrowed keys follow: the same greedy tokens as plain decoding."""
    write_tiny("gemma4", tmp_path)
    write_tiny_tokenizer(tmp_path)
    checkpoint = load_checkpoint(tmp_path)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    cache = KVCache.for_model(model.config, max_len=32)
    ids = _ids(16, seed=8)
    model(ids[:, :10], cache)
    model(ids[:, 10:13], cache)  # a branch, then back
    cache.truncate(10)
    again = model(ids[:, 10:16], cache)
    torch.testing.assert_close(again, model(ids)[:, 10:], atol=ATOL, rtol=0)
    total = Rounds()
    for prompt in ("a b c a b c a b", "the then there the then", "xyz xyz xy"):
        plain = generate(model, tokenizer, prompt, GREEDY, max_tokens=24, stop_token_ids=[])
        steps = list(speculative_stream(model, tokenizer, prompt, GREEDY, NgramDrafter(), k=4, rounds=total,
                                        max_tokens=24, stop_token_ids=[]))
        assert [s.token_id for s in steps] == plain.token_ids, prompt
    assert total.drafted > 0


def test_scheduler_with_prefix_cache_gives_each_requests_tokens_alone(tmp_path):
    """The server's path: three requests decoded together in the scheduler's SlotCache (rows of
    their own lengths, a finished one's slot refilled by the last), two sharing a 130-token start
    that the second takes from the prefix cache: each gets the tokens it gets alone."""
    write_tiny("gemma4", tmp_path)
    write_tiny_tokenizer(tmp_path)
    checkpoint = load_checkpoint(tmp_path)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    shared = _ids(130, seed=12)[0].tolist()
    prompts = [shared + _ids(6, seed=13)[0].tolist(), _ids(9, seed=14)[0].tolist(), shared + _ids(3, seed=15)[0].tolist()]
    budgets = [10, 4, 8]
    alone = [generate(model, tokenizer, p, GREEDY, max_tokens=n, stop_token_ids=[]).token_ids
             for p, n in zip(prompts, budgets, strict=True)]
    scheduler = Scheduler(model, max_running=3, max_len=160, prefix_cache_tokens=256)
    scheduler.start()

    async def run(prompt, budget, delay):
        await asyncio.sleep(delay)  # the third arrives once the first's blocks are in the prefix cache
        generation = Generation(model.config, tokenizer, prompt, GREEDY, max_tokens=budget, stop_token_ids=[])
        return [step.token_id async for step in scheduler.submit(generation)]

    async def main():
        return await asyncio.gather(*(run(p, n, 1.0 if i == 2 else 0) for i, (p, n) in
                                      enumerate(zip(prompts, budgets, strict=True))))

    try:
        together = asyncio.run(main())
    finally:
        scheduler.stop()
    assert together == alone
    assert scheduler.metrics.value("prefix_cache_reused_tokens_total") == 128


@torch.inference_mode()
def test_multimodal_checkpoint_runs_its_text_part(tmp_path):
    """model_type gemma4 (Gemma4ForConditionalGeneration, as every Gemma 4 on the hub): the text
    config nested in text_config, the text model's tensors under model.language_model, the vision
    tower left unread; text in, HF's logits out."""
    hf = write_tiny_gemma4_multimodal(SPECS["gemma4"][1], tmp_path, eos_token_id=[1, 106])
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "gemma4" and "vision_config" in saved
    ours = load_model(tmp_path)
    assert ours.config.model_type == "gemma4" and ours.config.eos_token_id == [1, 106]
    ids = _ids(20, seed=4, batch=2) % (VOCAB - 8)  # no image / audio placeholders: text only
    torch.testing.assert_close(ours(ids), hf(input_ids=ids).logits, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_hub_config_spelling_global_head_dim(pairs, tmp_path):
    """The hub's config.json (transformers before 5.25) says global_head_dim and
    num_global_key_value_heads where 5.25 writes per_layer_config: the same model either way."""
    hf, ours, directory = pairs("gemma4_k_eq_v")
    data = json.loads((directory / "config.json").read_text())
    assert data["per_layer_config"] == {"1": {"head_dim": 32, "num_key_value_heads": 1},
                                        "2": {"head_dim": 32, "num_key_value_heads": 1}}
    hub = {k: v for k, v in data.items() if k != "per_layer_config"}
    hub.update(global_head_dim=32, num_global_key_value_heads=1)
    for f in directory.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(hub))
    assert read_config(tmp_path) == ours.config
    ids = _ids(12, seed=9)
    torch.testing.assert_close(load_model(tmp_path)(ids), hf(ids).logits, atol=ATOL, rtol=0)
    # without num_global_key_value_heads the full layers keep num_key_value_heads; global_head_dim defaults to 512
    config = from_hf_config({k: v for k, v in hub.items() if k not in ("global_head_dim", "num_global_key_value_heads")})
    assert config.layer_head_dims == [16, 512, 512] and config.layer_kv_heads == [2, 2, 2]


@torch.inference_mode()
def test_router_choice_is_hfs(pairs):
    """capture.experts: every expert's probability as HF's router gives it, the k most probable
    chosen, their weights renormalised and scaled per expert."""
    hf, ours, _ = pairs("gemma4_moe")
    ids = _ids(12, seed=4)
    capture = AttentionCapture()
    ours(ids, capture=capture)
    ref = hf(ids, output_router_logits=True).router_logits  # Gemma 4 records its probabilities
    assert sorted(capture.experts) == [0, 1]
    for layer, probs in enumerate(ref):
        chosen, weights, got = capture.experts[layer]
        probs = probs.view(1, 12, -1).float()
        torch.testing.assert_close(got, probs, atol=1e-5, rtol=0)
        top = probs.topk(2, dim=-1)
        assert torch.equal(chosen, top.indices)
        scale = ours.layers[layer].router.per_expert_scale[chosen]
        torch.testing.assert_close(weights, top.values / top.values.sum(-1, keepdim=True) * scale, atol=1e-5, rtol=0)


def test_explainer_inspects_layers_of_both_head_sizes(pairs):
    """The explainer's inspection keeps each layer's q, k, v at its own head size; worked by hand,
    one query's weights are the model's on a sliding layer, a full one (heads twice the size) and a
    KV-shared one; a token's keys and values take the bytes of the layers that store any."""
    _, ours, _ = pairs("gemma4")
    ids = _ids(11, seed=6)[0].tolist()
    seen = lesson.inspect(ours, ids)
    assert [q.shape[-1] for q in seen.q] == [16, 32, 16, 16, 32]
    for layer in (0, 1, 3, 4):
        detail = lesson.attention_detail(seen, layer, 2, 10)
        assert detail["first"] == (6 if layer in (0, 3) else 0) and detail["head_dim"] == seen.q[layer].shape[-1]
        torch.testing.assert_close(detail["weights"], detail["model_weights"], atol=1e-6, rtol=1e-5)
    assert lesson.kv_cache_bytes_per_token(ours, torch.float32) == 2 * (2 * 16 + 2 * 32 + 2 * 16) * 4


def test_what_gemma4_does_not_do_says_so_in_one_line(pairs):
    _, ours, _ = pairs("gemma4")
    with pytest.raises(CompileUnavailable, match="Gemma 4's layers differ in their heads' size"):
        compile_decode(ours)
    with pytest.raises(ValueError, match=r"--tensor-parallel 2: gemma4_text's attention .* is not split"):
        check_world(ours.config, 2)
    base = {"model_type": "gemma4_text", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 96, "head_dim": 16, "num_key_value_heads": 2}
    for changes, message in (
        ({"use_bidirectional_attention": "all"}, "only causal models"),
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0}}}, "rope_type 'yarn' of full"),
        ({"per_layer_config": {"1": {"intermediate_size": 8}}}, r"overrides \['intermediate_size'\]"),
        ({"num_kv_shared_layers": 1, "layer_types": ["sliding_attention", "full_attention"]},
         "has no earlier layer of that kind"),
        ({"num_kv_shared_layers": 2}, "num_kv_shared_layers must be an integer in 0..1"),
        ({"model_type": "gemma4"}, "has no text_config object"),
    ):
        with pytest.raises(ConfigError, match=message):
            from_hf_config({**base, **changes})
