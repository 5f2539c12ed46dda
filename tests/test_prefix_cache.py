"""The prefix cache: a prompt that begins as an earlier one did reuses its keys and values, and
nothing it generates changes (bit-identical logits, same tokens through the official client, alone
or beside other requests); block matching, sharing, LRU eviction under a small budget, /metrics."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest
import torch

from live_server import LiveServer
from nexttok.checkpoints.loading import load_model
from nexttok.generation.prefill import BLOCK, prefill_chunks
from nexttok.models.cache import KVCache
from nexttok.models.slot_cache import SlotCache
from nexttok.server import ServerLimits, create_app, load_served
from nexttok.server.metrics import Metrics
from nexttok.server.prefix_cache import PrefixCache, prefill
from tiny_models import write_tiny

openai = pytest.importorskip("openai")

MODEL = "tiny"


@pytest.fixture(scope="module", params=["llama_gqa_llama3_rope", "mistral", "qwen2_sliding", "gpt2", "qwen3_moe", "gpt_oss",
                                        "gemma4"])
def model(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    write_tiny(request.param, directory)
    return load_model(directory)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


B = 32  # blocks small enough for the tiny models' contexts (gpt2's is 128); the server's is BLOCK


def _setup(model, capacity_tokens: int = 32 * B, slots: int = 3):
    cache = SlotCache.for_model(model.config, slots=slots, max_len=model.config.max_position_embeddings)
    return cache, PrefixCache(cache, capacity_tokens, Metrics(), block=B)


def _run(model, cache, ids, prefix):
    """Prefill ids into a fresh slot, cut at multiples of B: (its slot, logits)."""
    with torch.inference_mode():
        slot = cache.claim()
        return slot, prefill(model, cache, slot, ids, prefix, block=B)


def test_prefill_chunks_are_cut_at_multiples_of_the_block():
    assert prefill_chunks(0, 150, 64) == [(0, 64), (64, 128), (128, 150)]
    assert prefill_chunks(64, 150, 64) == [(64, 128), (128, 150)]
    assert prefill_chunks(0, 64, 64) == [(0, 64)]
    assert prefill_chunks(128, 129, 64) == [(128, 129)]


def test_a_reused_prefix_gives_the_same_bits_as_prefilling_it(model):
    """Keys, values and logits of the second prompt: equal with the first prompt's blocks reused and
    without any cache (the chunks are cut at the same places either way)."""
    first = _tokens(100, 0)  # 3 whole blocks
    second = first + _tokens(25, 1)
    cache, prefix = _setup(model)
    _run(model, cache, first, prefix)
    hit, with_cache = _run(model, cache, second, prefix)
    fresh, without = _run(model, cache, second, None)
    assert prefix.metrics.value("prefix_cache_reused_tokens_total") == 3 * B
    assert torch.equal(with_cache, without)
    n = len(second)  # every group of layers (Gemma 4's layers store keys of two shapes)
    for (k, v), (k_fresh, v_fresh) in zip(cache.keys_values(hit, 0, n), cache.keys_values(fresh, 0, n), strict=True):
        assert torch.equal(k, k_fresh) and torch.equal(v, v_fresh)


def test_chunked_prefill_against_one_call(model):
    """Honest about what the fixed cut costs: a prompt of one block or less is prefilled in one call,
    as generate() does, bit for bit; a longer one differs from one call in the last float bits only."""
    short, long = _tokens(B, 2), _tokens(120, 3)
    cache, _ = _setup(model)
    with torch.inference_mode():
        for ids in (short, long):
            _, chunked = _run(model, cache, ids, None)
            one_call = model(torch.tensor([ids]), KVCache.for_model(model.config), last_only=True)[0, -1]  # generate()
            if len(ids) <= B:
                assert torch.equal(chunked, one_call)
            else:
                torch.testing.assert_close(chunked, one_call, rtol=1e-4, atol=1e-4)
                assert int(chunked.argmax()) == int(one_call.argmax())


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama_prefix")
    write_tiny("llama_gqa_llama3_rope", directory)
    return load_model(directory)


def test_matches_whole_blocks_and_never_the_last_token(llama):
    cache, prefix = _setup(llama, slots=8)
    ids = _tokens(2 * B, 4)
    _run(llama, cache, ids, prefix)
    assert prefix.tokens == 2 * B  # both whole blocks kept
    assert len(prefix.match(ids)) == 1  # the same prompt again: its last block is prefilled for the logits
    assert len(prefix.match(ids + [5])) == 2
    assert len(prefix.match(ids[:B] + [(ids[B] + 1) % 128] + ids[B + 1 :] + [5])) == 1
    assert prefix.match([(ids[0] + 1) % 128, *ids[1:]]) == []
    assert prefix.match(ids[: B - 1]) == []  # shorter than a block


def test_prompts_sharing_a_start_store_it_once(llama):
    cache, prefix = _setup(llama, slots=8)
    system = _tokens(B, 5)
    _run(llama, cache, system + _tokens(B, 6), prefix)
    _run(llama, cache, system + _tokens(B, 7), prefix)
    assert prefix.tokens == 3 * B  # the shared block once, then one block of each branch
    assert prefix.metrics.value("prefix_cache_reused_tokens_total") == B


def test_eviction_takes_the_least_recently_used_leaf(llama):
    cache, prefix = _setup(llama, capacity_tokens=3 * B, slots=8)
    a, b = _tokens(2 * B + 1, 8), _tokens(2 * B + 1, 9)
    _run(llama, cache, a, prefix)  # a1 <- a2
    _run(llama, cache, b, prefix)  # b1 <- b2: a2 goes (a1 has a child, so it is not a leaf)
    assert prefix.tokens == 3 * B
    assert prefix.metrics.value("prefix_cache_evicted_tokens_total") == B
    assert [len(prefix.match(p)) for p in (a, b)] == [1, 2]
    slot, again = _run(llama, cache, a, prefix)  # reuses a1, prefills a2 again and keeps it: b2 goes
    assert prefix.metrics.value("prefix_cache_evicted_tokens_total") == 2 * B
    assert prefix.tokens <= 3 * B
    assert [len(prefix.match(p)) for p in (a, b)] == [2, 1]
    _, fresh = _run(llama, cache, a, None)
    assert torch.equal(again, fresh)


def test_a_chain_longer_than_the_pool_keeps_its_start(llama):
    cache, prefix = _setup(llama, capacity_tokens=2 * B, slots=8)
    ids = _tokens(4 * B, 10)
    _run(llama, cache, ids, prefix)
    assert prefix.tokens == 2 * B and len(prefix.match(ids)) == 2


def test_limits_check_the_budget():
    assert ServerLimits(prefix_cache_tokens=0).prefix_cache_tokens == 0
    for bad in (-1, BLOCK - 1, float(BLOCK), None):
        with pytest.raises(ValueError, match="prefix_cache_tokens"):
            ServerLimits(prefix_cache_tokens=bad)


def test_serve_passes_the_option_on(monkeypatch):
    import nexttok.server as server
    from nexttok.cli import main

    seen = []
    monkeypatch.setattr(server, "load_served", lambda *a, **k: SimpleNamespace(name="m"))
    monkeypatch.setattr(server, "create_app", lambda served, **k: seen.append(k["limits"]))
    monkeypatch.setattr(server, "serve_in_main_thread", lambda *a, **k: None)
    monkeypatch.setattr("nexttok.cli.serve._listen", lambda host, port: None)  # port 8000 may be taken here
    assert main(["serve", "m", "--prefix-cache-tokens", "0"]) == 0
    assert main(["serve", "m"]) == 0
    assert [limits.prefix_cache_tokens for limits in seen] == [0, 8192]
    assert main(["serve", "m", "--prefix-cache-tokens", "10"]) == 2


# -- through the server and the official client ------------------------------------------------

SYSTEMS = ["You are a patient guide to the history of the printing press. Answer in short, plain sentences "
           "and say when you are unsure; never invent dates, names or places you do not know for certain. When "
           "a question is vague, pick the most likely meaning and say which one you picked. Prefer examples from "
           "Europe and East Asia, and compare the two where it helps the reader see what changed and why.",
           "You review Python code for a small team. Point out bugs first, then style, and keep every remark "
           "to one line; quote the line you mean, and suggest the smallest change that fixes it. Do not rewrite "
           "whole functions, do not comment on naming unless it misleads, and say so plainly when the code is "
           "fine as it is. Tests come last: name the case that is missing, not the framework to use."]
QUESTIONS = ["Where do we start?", "Tell me more about that.", "Why did it matter?", "Who disagreed, and why?",
             "What came next?", "Sum it all up in two lines."]
GREEDY = dict(temperature=0, max_tokens=24, logprobs=True, top_logprobs=2,
              logit_bias={"50256": -100})  # no early EOS: every answer is max_tokens long


def _turn(client, messages) -> tuple[str, list]:
    """One greedy answer: (text, [(token, logprob, top alternatives)])."""
    choice = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY).choices[0]
    return choice.message.content, [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                                    for t in choice.logprobs.content]


def _chats(url: str) -> list[list]:
    """Two 6-turn chats, their turns interleaved (so a small cache must evict); every answer."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    histories = [[{"role": "system", "content": system}] for system in SYSTEMS]
    answers: list[list] = [[], []]
    for question in QUESTIONS:
        for history, out in zip(histories, answers, strict=True):
            history.append({"role": "user", "content": question})
            text, tokens = _turn(client, history)
            history.append({"role": "assistant", "content": text})
            out.append((text, tokens))
    return answers, histories


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}


@pytest.fixture(scope="module")
def chats(chat_model_dir):
    """The two chats through three servers: no prefix cache, the default one, one of two blocks."""
    results = {}
    for name, tokens in (("off", 0), ("on", 8192), ("small", 2 * BLOCK)):
        served = load_served(str(chat_model_dir), MODEL)
        with LiveServer(create_app([served], limits=ServerLimits(prefix_cache_tokens=tokens))) as live:
            answers, histories = _chats(live.url)
            results[name] = answers, histories, _metrics(live.url)
            if name == "on":
                results["invariance"] = _alone_and_beside_others(live.url, histories)
    return results


def test_greedy_tokens_identical_with_and_without_the_prefix_cache(chats):
    """Six turns of two chats (the official client): the same text, tokens and logprobs (to the last
    bit: the reused keys are the very ones a prefill computes) with the cache, a tiny one, or none."""
    off = chats["off"][0]
    assert chats["on"][0] == off
    assert chats["small"][0] == off
    assert all(len(tokens) == GREEDY["max_tokens"] for chat in off for _, tokens in chat)


def test_metrics_count_hits_reuse_and_evictions(chats):
    off, on, small = (chats[name][2] for name in ("off", "on", "small"))
    assert off["nexttok_prefix_cache_capacity_tokens"] == 0 and off["nexttok_prefix_cache_queries_total"] == 0
    assert on["nexttok_prefix_cache_capacity_tokens"] == 8192
    assert on["nexttok_prefix_cache_queries_total"] >= 12
    assert on["nexttok_prefix_cache_hits_total"] >= 10  # turns 2-6 of both chats reuse the turn before
    reused, looked_up = on["nexttok_prefix_cache_reused_tokens_total"], on["nexttok_prefix_cache_query_tokens_total"]
    assert reused > 0 and reused % BLOCK == 0
    assert on["nexttok_prefix_cache_hit_rate"] == pytest.approx(reused / looked_up, abs=1e-5)
    assert on["nexttok_prefix_cache_hit_rate"] > 0.5
    assert on["nexttok_prefix_cache_evicted_tokens_total"] == 0
    assert 0 < on["nexttok_prefix_cache_tokens"] <= 8192
    assert small["nexttok_prefix_cache_evicted_tokens_total"] > 0  # two blocks cannot hold two chats
    assert small["nexttok_prefix_cache_tokens"] <= 2 * BLOCK
    assert small["nexttok_prefix_cache_reused_tokens_total"] < reused


def _alone_and_beside_others(url: str, histories: list) -> tuple[list, list]:
    """A 7th turn of the first chat (its prompt's start cached), alone, then while six other requests
    run (the other chat's next turn, fresh prompts, and the same turn again)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    target = [*histories[0], {"role": "user", "content": "One more thing?"}]
    others = [[*histories[1], {"role": "user", "content": "And then?"}], target,
              *[[{"role": "user", "content": f"Request {i}: say something about the number {i}."}] for i in range(4)]]
    alone = _turn(client, target)
    with ThreadPoolExecutor(7) as pool:
        results = list(pool.map(lambda m: _turn(client, m), [target, *others]))
    return alone, results


def test_batch_invariance_kept_with_the_prefix_cache(chats):
    alone, together = chats["invariance"]
    assert together[0] == alone  # beside six others (one of them the same prompt, sharing its blocks)
    assert together[2] == alone

