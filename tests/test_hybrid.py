"""Hybrid models (LFM2: short convolutions between attention layers) past what tests/test_models.py
checks for every SPECS entry: HF transformers' logits in a padded batch, the recurrent state's
fixed size beside the keys that grow, the server's slots, and each feature that cannot roll a
state back either working or refusing in one line."""

from __future__ import annotations

import json

import pytest
import torch

from nexttok.generation.prefill import prefill
from nexttok.models.cache import KVCache, StateRollback
from nexttok.models.compiled import CompileUnavailable, compile_decode
from nexttok.models.slot_cache import SlotCache
from nexttok.parallel.layers import check_world
from tiny_models import VOCAB, write_tiny, write_tiny_tokenizer

ATOL = 1e-4


def _ids(n: int, seed: int = 1, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ["lfm2", "qwen3_next", "qwen3_5"])
@torch.inference_mode()
def test_padded_batch_gives_hfs_logits_as_hf_pads_it(pairs, name):
    """Left padding enters neither the attention nor a recurrent layer's state (LFM2's convolution
    window, the DeltaNet's convolution and state): HF's padded batch (attention_mask) and ours
    (positions -1), row by row, then cached steps of both rows."""
    hf, ours, _ = pairs(name)
    short, long = _ids(9, seed=3)[0], _ids(14, seed=4)[0]
    batch = torch.zeros(2, 14, dtype=torch.long)
    positions = torch.full((2, 14), -1)
    batch[0, 5:], positions[0, 5:] = short, torch.arange(9)
    batch[1], positions[1] = long, torch.arange(14)
    mask = (positions >= 0).long()
    expected = hf(batch, attention_mask=mask).logits
    cache = KVCache.for_model(ours.config, batch=2, max_len=20)
    got = ours(batch, cache, positions)
    torch.testing.assert_close(got[0, 5:], expected[0, 5:], atol=ATOL, rtol=0)
    torch.testing.assert_close(got[1], expected[1], atol=ATOL, rtol=0)
    torch.testing.assert_close(got[0, 5:], hf(short[None]).logits[0], atol=ATOL, rtol=0)  # as alone
    nexts = _ids(3, seed=7, batch=2)
    for i in range(3):
        step = ours(nexts[:, i : i + 1], cache, torch.tensor([[9 + i], [14 + i]]))[:, 0]
        for row, prompt in enumerate((short, long)):
            alone = hf(torch.cat((prompt, nexts[row, : i + 1]))[None]).logits[0, -1]
            torch.testing.assert_close(step[row], alone, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_the_state_stays_one_size_while_the_keys_grow(pairs):
    """Keys and values are kept for the attention layers only; each convolution layer keeps its last
    kernel - 1 inputs, whatever the context's length. A prefill in chunks (the state carried over
    each chunk's edge) gives the one-call logits."""
    _, ours, _ = pairs("lfm2")
    config = ours.config
    assert config.recurrent_layers == [0, 2, 3] and config.attention_layers == [1]
    cache = KVCache.for_model(config, max_len=64)
    assert cache.k.shape[0] == 1  # one attention layer's rows, not four
    ids = _ids(60, seed=5)
    whole = ours(ids, KVCache.for_model(config, max_len=64))[0, -1]
    ours(ids[:, :10], cache)
    sizes = [cache.state_bytes()]
    chunked = prefill(ours, cache, ids[0].tolist(), start=10, block=16)
    sizes.append(cache.state_bytes())
    per_layer = config.hidden_size * (config.conv_kernel - 1) * 4  # float32
    assert sizes == [3 * per_layer, 3 * per_layer]
    torch.testing.assert_close(chunked, whole, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_a_state_goes_back_only_to_the_start(pairs):
    _, ours, _ = pairs("lfm2")
    ids = _ids(12, seed=6)
    cache = KVCache.for_model(ours.config, max_len=16)
    first = ours(ids, cache)
    with pytest.raises(StateRollback, match=r"recurrent layers \[0, 2, 3\] keep a state that cannot be taken back "
                                            r"to token 5 of 12") as error:
        cache.truncate(5)
    assert "\n" not in str(error.value)
    cache.truncate(12)  # where it is: nothing to take back
    cache.truncate(0)  # the start: every state zero again
    torch.testing.assert_close(ours(ids, cache), first, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["lfm2", "qwen3_5"])
@torch.inference_mode()
def test_server_slots_decode_together_as_alone(pairs, name):
    """The server's SlotCache: each slot's state is its own (a claimed slot starts from zeros, a
    released one takes the last slot's state), rows at lengths of their own, scratch rows; for LFM2's
    convolutions and Qwen3.5's DeltaNet states alike."""
    _, ours, _ = pairs(name)
    prompts = [_ids(n, seed=40 + n)[0].tolist() for n in (29, 6, 31)]

    def decode(group, release_first=False):
        cache = SlotCache.for_model(ours.config, slots=3, max_len=48)
        if release_first:  # a slot used and given back before: its state must not leak
            ours(torch.tensor([prompts[2]]), cache.row(cache.claim()))
            cache.release(0)
        out = [[ours(torch.tensor([p]), cache.row(cache.claim()), last_only=True)[0, -1]] for p in group]
        for step in range(5):
            if step == 2 and len(group) == 3:  # the first leaves; the last moves into its slot
                cache.release(0)
                out = [out[2], out[1], out[0]]
                group = [group[2], group[1]]
            view = cache.running_view(3)
            ids = torch.tensor([[int(out[min(r, len(group) - 1)][-1].argmax())] for r in range(view.n)])
            positions = torch.tensor([[cache.lengths[min(r, len(group) - 1)]] for r in range(view.n)])
            logits = ours(ids, view, positions, last_only=True)[:, -1]
            view.release_scratch()
            for r in range(len(group)):
                out[r].append(logits[r])
        return out

    together = decode(prompts)
    for p, seq in zip((prompts[2], prompts[1]), together[:2], strict=True):  # the last (moved), the middle
        alone = decode([p], release_first=True)[0]
        torch.testing.assert_close(torch.stack(alone), torch.stack(seq), atol=ATOL, rtol=0)
    with pytest.raises(StateRollback, match="cannot start from stored keys and values"):
        SlotCache.for_model(ours.config, slots=1, max_len=8).load(0, [(torch.zeros(1, 2, 3, 16), torch.zeros(1, 2, 3, 16))])


def test_what_cannot_hold_a_state_refuses_in_one_line(pairs):
    _, ours, _ = pairs("lfm2")
    with pytest.raises(CompileUnavailable, match=r"recurrent layers \(lfm2\) update a state"):
        compile_decode(ours)
    with pytest.raises(ValueError, match=r"--tensor-parallel 2: recurrent layers \(lfm2\) are not split"):
        check_world(ours.config, 2)


@pytest.mark.parametrize("name", ["lfm2", "qwen3_5"])
def test_nexttok_run_as_a_new_user_would_and_speculation_refused(tmp_path, capsys, name):
    """`nexttok run DIR` generates on a tiny LFM2 / Qwen3.5 (the same tokens as the library's loop,
    which the cached steps tie to HF); --speculative ngram is refused in one line, naming why."""
    from nexttok.checkpoints.loading import load_checkpoint
    from nexttok.cli import main
    from nexttok.generation.loop import generate
    from nexttok.generation.sampling import SamplingParams

    write_tiny(name, tmp_path)
    write_tiny_tokenizer(tmp_path)
    assert main(["run", str(tmp_path), "Hello there", "--temperature", "0", "--max-tokens", "6", "--json"]) == 0
    steps = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    checkpoint = load_checkpoint(tmp_path)
    expected = generate(checkpoint.model, checkpoint.tokenizer, "Hello there", SamplingParams(temperature=0),
                        max_tokens=6)
    assert [s["token_id"] for s in steps] == expected.token_ids and len(steps) == 6
    assert main(["run", str(tmp_path), "Hello there", "--max-tokens", "4", "--speculative", "ngram"]) != 0
    err = capsys.readouterr().err.strip()
    assert "recurrent layers keep a state that cannot take back a refused draft token" in err
    assert len(err.splitlines()) == 1


@torch.inference_mode()
def test_gguf_in_llama_cpps_lfm2_layout_gives_hfs_logits(pairs, tmp_path):
    """Our exporter writes llama.cpp's lfm2 (head_count_kv 0 on the convolution layers, the kernel as
    shortconv.l_cache, the convolution's weight (hidden, kernel), the final norm as token_embd_norm);
    the loader reads the layer types back from it: HF's logits at every cached step, and Q8_0 within
    its 8 bits."""
    from gguf import GGUFReader

    from nexttok.checkpoints.export import write_gguf
    from nexttok.checkpoints.loading import load_model

    hf, _, directory = pairs("lfm2")
    write_tiny_tokenizer(directory)
    path = write_gguf(directory, tmp_path / "lfm2-F32.gguf", "F32")
    fields = GGUFReader(str(path)).fields
    assert fields["general.architecture"].contents() == "lfm2"
    assert fields["lfm2.attention.head_count_kv"].contents() == [0, 2, 0, 0]
    assert fields["lfm2.shortconv.l_cache"].contents() == 3
    ours = load_model(path)
    assert ours.config.layer_types == ["conv", "full_attention", "conv", "conv"] and ours.config.conv_kernel == 3
    ids = _ids(20, seed=2)
    expected = hf(ids).logits
    cache = KVCache.for_model(ours.config, max_len=24)
    torch.testing.assert_close(ours(ids[:, :8], cache), expected[:, :8], atol=ATOL, rtol=0)
    for t in range(8, 20):
        torch.testing.assert_close(ours(ids[:, t : t + 1], cache)[:, 0], expected[:, t], atol=ATOL, rtol=0)
    quantized = load_model(write_gguf(directory, tmp_path / "lfm2-Q8_0.gguf", "Q8_0"))
    got = quantized(ids)
    assert (got - expected).abs().mean() <= 0.015 * expected.abs().max()
