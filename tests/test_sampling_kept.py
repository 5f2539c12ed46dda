"""The sampler's short paths, which run once the block kernels are loaded (as they are in any process
that has run a GGUF model): top-k's kept logits go through the later stages as a numpy array
(apply_kept), the draw over them is one C++ call (kernels.pick) and greedy's argmax is numpy's. Each
equals the path it shortens: the torch stage bit for bit, numpy's pick token for token, torch's
argmax (the first of equal maxima). tests/test_sampling.py checks that the whole chain draws what the
stage-by-stage chain (the explainer's) draws, its final logits HF's warpers', on both paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nexttok.generation.sampling import Greedy, pick_probabilities
from nexttok.generation.stages import NEG_INF, MinP, Temperature, TopP
from nexttok.models import kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the block kernels are not built here")


@pytest.fixture(autouse=True)
def loaded():
    kernels.load()


def _rows(seed: int, n: int = 40, count: int = 50):
    """Rows like top-k's kept logits: spread out, some cut to -inf by an earlier stage, some tied."""
    gen = torch.Generator().manual_seed(seed)
    for i in range(count):
        row = torch.randn(n, generator=gen) * 2.5
        if i % 3 == 1:
            row[torch.rand(n, generator=gen) < 0.3] = NEG_INF
            row[int(row.argmax())] = 4.0  # never all cut
        if i % 5 == 2:
            row = (row * 2).round() / 2  # ties
        yield row


@pytest.mark.parametrize("stage", [TopP(0.3), TopP(0.9), TopP(0.95), MinP(0.05), MinP(0.3), Temperature(0.8),
                                   Temperature(0.8, 0.5), Temperature(0.7, 0.7, 2.0)],
                         ids=lambda s: f"{s.name}")
def test_each_stage_on_kept_values_equals_its_torch_apply(stage):
    for row in _rows(1):
        expected = stage.apply(row)
        got = stage.apply_kept(row.numpy())
        assert got.dtype == np.float32 and torch.equal(torch.from_numpy(got), expected), stage.name


@pytest.mark.parametrize("n", [1, 2, 40, 200, 1024])
def test_the_kernels_pick_equals_numpys(n):
    gen = torch.Generator().manual_seed(n)
    for row in _rows(n, n, 40):
        probs = row.softmax(-1)
        for u in [0.0, 0.999999, *torch.rand(20, generator=gen).tolist()]:
            assert kernels.pick(probs, u) == pick_probabilities(probs.numpy(), u)


def test_the_kernels_pick_refuses_what_it_cannot_draw_from():
    with pytest.raises(RuntimeError, match=r"nexttok_q.pick: u must be in \[0, 1\), got 1"):
        kernels.pick(torch.tensor([0.5, 0.5]), 1.0)
    with pytest.raises(RuntimeError, match="nexttok_q.pick: no token has a probability above 0"):
        kernels.pick(torch.zeros(3), 0.5)


def test_greedy_is_the_first_of_equal_maxima():
    gen = torch.Generator().manual_seed(3)
    for _ in range(50):
        row = (torch.randn(49152, generator=gen) * 4).round()  # many ties at the top
        assert Greedy().select(row) == (int(torch.argmax(row)), None)
