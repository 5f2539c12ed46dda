"""SlotCache: sequences of different lengths decoded together, exactly as each alone."""

from __future__ import annotations

import pytest
import torch

from nexttok.checkpoints.loading import load_model
from nexttok.models.slot_cache import SlotCache
from tiny_models import write_tiny


@pytest.fixture(scope="module", params=["llama_gqa_llama3_rope", "mistral", "gpt2", "gemma4"])
def model(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    write_tiny(request.param, directory)
    return load_model(directory)


def _decode(model, prompts, steps, pad_to, release_first_after=None):
    """Greedy tokens of each prompt, all running together in one SlotCache."""
    cache = SlotCache.for_model(model.config, slots=4, max_len=64)
    seqs = []
    with torch.inference_mode():
        for p in prompts:
            slot = cache.claim()
            logits = model(torch.tensor([p]), cache.row(slot), last_only=True)[0, -1]
            seqs.append([*p, int(logits.argmax())])
        owner = list(range(len(prompts)))  # slot -> prompt index
        for step in range(steps):
            view = cache.running_view(pad_to)
            rows = owner + owner[:1] * (view.n - len(owner))
            ids = torch.tensor([[seqs[i][-1]] for i in rows])
            positions = torch.tensor([[cache.lengths[slot if slot < len(owner) else 0]] for slot in range(view.n)])
            logits = model(ids, view, positions, last_only=True)[:, -1]
            view.release_scratch()
            for slot, i in enumerate(owner):
                seqs[i].append(int(logits[slot].argmax()))
            if step == release_first_after:
                moved = cache.release(0)
                owner[0] = owner[moved] if moved is not None else owner[0]
                owner.pop()
    return seqs


def test_batch_equals_each_alone_bit_for_bit(model):
    torch.manual_seed(0)
    prompts = [torch.randint(0, 128, (n,)).tolist() for n in (5, 11, 3, 8)]
    together = _decode(model, prompts, 6, pad_to=4)
    for p, seq in zip(prompts, together, strict=True):
        assert _decode(model, [p], 6, pad_to=4)[0] == seq


def test_leaving_the_batch_moves_the_last_slot(model):
    torch.manual_seed(1)
    prompts = [torch.randint(0, 128, (n,)).tolist() for n in (4, 7, 9)]
    seqs = _decode(model, prompts, 8, pad_to=4, release_first_after=2)
    for p, seq in zip(prompts[1:], seqs[1:], strict=True):
        assert _decode(model, [p], 8, pad_to=4)[0] == seq


def test_claim_and_release():
    cache = SlotCache(1, 2, 1, 8, 2)
    assert (cache.claim(), cache.claim()) == (0, 1)
    with pytest.raises(RuntimeError, match="no free slot"):
        cache.claim()
    assert cache.release(0) == 1 and cache.running == 1
    assert cache.release(0) is None and cache.running == 0
