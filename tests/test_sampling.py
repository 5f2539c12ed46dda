"""Each sampler stage by hand and against HF's logits processors; the draw, statistically."""

from __future__ import annotations

import math
import re

import pytest
import torch

from nexttok.generation.parameters import PARAMETERS
from nexttok.generation.sampling import SamplerChain, SamplingParams, entropy_bits, pick
from nexttok.generation.stages import (
    NEG_INF,
    History,
    LogitBias,
    MinP,
    Penalties,
    Temperature,
    TopK,
    TopP,
    check_token_ids,
)


def _logits(probs) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float32).log()  # log(0) = -inf: cut from the start


def _kept(logits: torch.Tensor) -> list[int]:
    return torch.nonzero(logits > float("-inf")).flatten().tolist()


def test_top_p_keeps_smallest_set_reaching_p():
    assert _kept(TopP(0.3).apply(_logits([0.9, 0, 0, 0.1]))) == [0]
    assert _kept(TopP(0.9).apply(_logits([0.5, 0.3, 0.15, 0.05]))) == [0, 1, 2]
    assert _kept(TopP(1.0).apply(_logits([0.5, 0.3, 0.15, 0.05]))) == [0, 1, 2, 3]
    assert _kept(TopP(0.01).apply(_logits([0.25, 0.25, 0.5]))) == [2]


def test_top_k_keeps_ties_with_the_kth():
    assert _kept(TopK(2).apply(torch.tensor([1.0, 3.0, 2.0, 0.0]))) == [1, 2]
    assert _kept(TopK(2).apply(torch.tensor([1.0, 1.0, 1.0, 0.0]))) == [0, 1, 2]
    assert _kept(TopK(10).apply(torch.tensor([1.0, 0.0]))) == [0, 1]


def test_min_p_is_relative_to_the_top_token():
    assert _kept(MinP(0.2).apply(_logits([0.5, 0.3, 0.09, 0.11]))) == [0, 1, 3]


def test_temperature_rescales():
    out = Temperature(2.0).apply(torch.tensor([2.0, -4.0]))
    assert out.tolist() == [1.0, -2.0]
    sharp = Temperature(0.5).apply(_logits([0.6, 0.4])).softmax(-1)
    assert sharp[0] == pytest.approx(0.36 / 0.52, abs=1e-6)


def test_penalties():
    history = History.start([0], 4)  # token 0 in the prompt
    history.add(1)
    history.add(1)
    history.add(2)
    logits = torch.tensor([2.0, -2.0, 1.0, 1.0])
    assert Penalties(2.0, 0, 0, history).apply(logits).tolist() == [1.0, -4.0, 0.5, 1.0]
    # presence/frequency count generated tokens only (OpenAI, vLLM): token 0 is prompt-only
    assert Penalties(1.0, 0.5, 0.25, history).apply(logits).tolist() == [2.0, -3.0, 0.25, 1.0]


def test_penalties_keep_their_own_history():
    """A penalty stage remembers each token it is told (accept); the stateless stages ignore it."""
    penalties = Penalties(1.0, 1.0, 0.0, History.start([], 4))
    logits = torch.zeros(4)
    assert penalties.apply(logits).tolist() == [0.0, 0.0, 0.0, 0.0]
    penalties.accept(2)
    penalties.accept(2)
    assert penalties.apply(logits).tolist() == [0.0, 0.0, -1.0, 0.0]  # presence: once, however often
    top_k = TopK(2)
    before = top_k.apply(torch.tensor([1.0, 3.0, 2.0, 0.0]))
    top_k.accept(1)
    assert torch.equal(top_k.apply(torch.tensor([1.0, 3.0, 2.0, 0.0])), before)


def test_logit_bias():
    out = LogitBias({3: 100.0, 0: -100.0}, 4).apply(torch.zeros(4))
    assert out.tolist() == [-100.0, 0.0, 0.0, 100.0]
    with pytest.raises(ValueError, match="logit_bias token id 9 is outside the vocabulary \\(0..3\\)"):
        LogitBias({9: 1.0}, 4)


def test_order_matters_temperature_before_top_p():
    logits = _logits([0.7, 0.2, 0.1])
    default = SamplerChain.from_params(SamplingParams(temperature=0.5, top_p=0.85), 3)
    temp_first = SamplerChain.from_params(
        SamplingParams(temperature=0.5, top_p=0.85, order=["temperature", "top_p"]), 3)
    assert [s.name for s in default.stages] == ["top_p", "temperature"]
    assert _kept(default.apply(logits)) == [0, 1]  # top_p saw the untempered 0.7/0.2/0.1
    assert _kept(temp_first.apply(logits)) == [0]  # sharpened first: 0.907 alone reaches 0.85


def test_neutral_settings_build_no_stage():
    assert SamplerChain.from_params(SamplingParams(), 8).stages == []
    greedy = SamplerChain.from_params(SamplingParams(temperature=0, top_k=5, top_p=0.5), 8)
    assert greedy.stages == [] and greedy.greedy


@pytest.mark.parametrize("seed", range(5))
def test_stages_match_hf_logits_processors(seed):
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(1000, generator=gen) * 3
    prompt = torch.randint(0, 1000, (30,), generator=gen)
    history = History.start(prompt.tolist(), 1000)
    cases = [
        (TopK(50), TopKLogitsWarper(50)),
        (TopP(0.8), TopPLogitsWarper(0.8)),
        (MinP(0.05), MinPLogitsWarper(0.05)),
        (Temperature(0.7), TemperatureLogitsWarper(0.7)),
        (Penalties(1.3, 0, 0, history), RepetitionPenaltyLogitsProcessor(1.3)),
    ]
    for ours, theirs in cases:
        expected = theirs(prompt[None], logits[None].clone())[0]
        torch.testing.assert_close(ours.apply(logits), expected, msg=type(ours).__name__)


@pytest.mark.parametrize("changes,message", [
    ({"temperature": -0.1}, "temperature must be a number >= 0, got -0.1"),
    ({"temperature": float("nan")}, "temperature must be a number >= 0, got nan"),
    ({"temperature": "hot"}, "temperature must be a number >= 0"),
    ({"top_p": 0.0}, "top_p must be in \\(0, 1\\], got 0.0"),
    ({"top_p": 1.5}, "top_p must be in \\(0, 1\\]"),
    ({"top_k": -1}, "top_k must be an integer >= 0, got -1"),
    ({"top_k": 2.5}, "top_k must be an integer >= 0"),
    ({"min_p": 1.1}, "min_p must be in \\[0, 1\\]"),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be in \\(0, 100\\], got 0.0"),
    ({"repetition_penalty": 101.0}, "repetition_penalty must be in \\(0, 100\\], got 101.0"),
    ({"presence_penalty": 2.5}, "presence_penalty must be in \\[-2, 2\\]"),
    ({"frequency_penalty": -3}, "frequency_penalty must be in \\[-2, 2\\]"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias keys must be token ids"),
    ({"logit_bias": {5: 200.0}}, "logit_bias\\[5\\] must be in \\[-100, 100\\]"),
    ({"seed": -1}, "seed must be an integer in \\[0, 2\\*\\*63\\), got -1"),
    ({"seed": 2**63}, "seed must be an integer in \\[0, 2\\*\\*63\\)"),
    ({"seed": True}, "seed must be an integer"),
    ({"order": ["top_k", "magic"]}, "order must list distinct stages"),
    ({"order": ["top_k", "top_k"]}, "order must list distinct stages"),
])
def test_bad_params_name_the_parameter(changes, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**changes)


@pytest.mark.parametrize("temperature", [0.8, 0.0])  # 0: a plain greedy chain's one pass
def test_non_finite_logits_are_refused(temperature):
    chain = SamplerChain.from_params(SamplingParams(seed=0, temperature=temperature), 3)
    assert chain.greedy == (temperature == 0) and not (chain.greedy and chain.stages)
    with pytest.raises(ValueError, match="1 NaN/\\+inf logits"):
        chain.sample(torch.tensor([0.0, float("nan"), 1.0]))
    with pytest.raises(ValueError, match="1 NaN/\\+inf logits"):
        chain.sample(torch.tensor([2.0, 1.0, float("nan")]))  # after the largest finite one
    with pytest.raises(ValueError, match="NaN/\\+inf"):
        chain.sample(torch.tensor([0.0, float("inf"), 1.0]))
    with pytest.raises(ValueError, match="every token has -inf logit"):
        chain.sample(torch.full((3,), float("-inf")))
    assert chain.sample(torch.tensor([float("-inf"), 1.0, 1.0])).token_id == 1  # the first of a tie


def test_pick_walks_tokens_by_probability():
    logits = _logits([0.2, 0.5, 0.3, 0.0])
    assert pick(logits, 0.0) == 1
    assert pick(logits, 0.49) == 1
    assert pick(logits, 0.51) == 2
    assert pick(logits, 0.81) == 0
    assert pick(logits, 0.9999999) == 0  # never the cut token 3


def _reference_pick(logits: torch.Tensor, u: float) -> int:
    """The inverse-CDF draw written plainly: every token sorted by probability (equal ones by id,
    a stable sort), float64 sums, the first whose cumulative probability passes u."""
    probs = logits.double().softmax(-1)
    order = sorted(range(len(probs)), key=lambda i: (-float(probs[i]), i))
    total, target = 0.0, u * float(probs.sum())
    kept = [i for i in order if probs[i] > 0]
    for i in kept:
        total += float(probs[i])
        if total > target:
            return i
    return kept[-1]


@pytest.mark.parametrize("size", [8, 1000, 49152])
def test_pick_equals_the_plain_inverse_cdf(size):
    gen = torch.Generator().manual_seed(size)
    for trial in range(40 if size < 49152 else 6):
        logits = torch.randn(size, generator=gen) * 4
        if trial % 2:
            logits = TopK(max(1, size // 20)).apply(logits)  # most tokens cut
        u = float(torch.rand((), generator=gen))
        assert pick(logits, u) == _reference_pick(logits, u)


def test_pick_breaks_ties_by_id():
    logits = torch.tensor([0.0, 1.0, 1.0, float("-inf"), 1.0])
    assert [pick(logits, u) for u in (0.1, 0.4, 0.7, 0.95)] == [1, 2, 4, 0]


@pytest.mark.parametrize("seed", range(3))
def test_top_p_over_a_whole_vocabulary_and_after_top_k_matches_hf(seed):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(49152, generator=torch.Generator().manual_seed(seed)) * 3
    ids = torch.zeros(1, 1, dtype=torch.long)
    for p in (0.5, 0.9, 0.95):
        whole = TopPLogitsWarper(p)(ids, logits[None].clone())[0]
        assert torch.equal(TopP(p).apply(logits) > NEG_INF, whole > NEG_INF)
        after_k = TopPLogitsWarper(p)(ids, TopKLogitsWarper(40)(ids, logits[None].clone()))[0]
        ours = TopP(p).apply(TopK(40).apply(logits))
        torch.testing.assert_close(ours, after_k)


@pytest.mark.parametrize("path", ["torch", "kernels"])
@pytest.mark.parametrize("seed", range(3))
def test_stages_after_top_k_run_on_its_kept_logits_as_on_the_vocabulary(seed, path, monkeypatch):
    """llama.cpp's default chain (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8) runs its later
    stages on top-k's 40 logits alone: the final row equals HF's warpers over the whole vocabulary,
    and every draw picks the token the stage-by-stage path (the explainer's, record=True) picks;
    on torch's ops, and with the kernels loaded (top-k's C++ pass, numpy's stages, kernels.pick)."""
    from nexttok.models import kernels

    if path == "kernels" and not kernels.available():
        pytest.skip("the block kernels are not built here")
    if path == "torch":
        monkeypatch.setattr(kernels, "row_ready", lambda x: False)
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(seed)
    ids = torch.zeros(1, 1, dtype=torch.long)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=seed)
    compact = SamplerChain.from_params(params, 49152)
    stepwise = SamplerChain.from_params(params, 49152)
    for _ in range(40):
        logits = torch.randn(49152, generator=gen) * 2.5
        assert kernels.row_ready(logits) == (path == "kernels")
        expected = logits[None].clone()
        for warper in (TopKLogitsWarper(40), TopPLogitsWarper(0.95), MinPLogitsWarper(0.05),
                       TemperatureLogitsWarper(0.8)):
            expected = warper(ids, expected)
        ours, theirs = compact.sample(logits), stepwise.sample(logits, record=True)
        torch.testing.assert_close(ours.logits, expected[0])
        torch.testing.assert_close(compact.apply(logits), expected[0])
        assert ours.token_id == theirs.token_id and ours.draw == theirs.draw
        assert 1 < int((ours.logits > NEG_INF).sum()) < 40  # top-p and min-p did cut something


def test_sampled_frequencies_match_softmax():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, 0.2])
    expected = logits.softmax(-1)
    chain = SamplerChain.from_params(SamplingParams(temperature=1.0, seed=1234), 8)
    n = 20_000
    counts = torch.zeros(8)
    for _ in range(n):
        counts[chain.sample(logits).token_id] += 1
    chi2 = float((((counts - n * expected) ** 2) / (n * expected)).sum())
    assert chi2 < 24.3, f"chi-square {chi2:.1f} over 7 degrees of freedom (p < 0.001 would fail)"


def test_same_seed_same_draws_and_other_seed_differs():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))

    def draws(seed):
        chain = SamplerChain.from_params(SamplingParams(temperature=1.3, top_p=0.9, seed=seed), 50)
        return [chain.sample(logits).token_id for _ in range(40)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_recording_each_stage():
    chain = SamplerChain.from_params(SamplingParams(temperature=0.5, top_k=3, top_p=0.9, seed=0), 6)
    assert chain.sample(torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -2.0])).stages is None  # only when asked
    record = chain.sample(torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -2.0]), record=True).stages
    assert [r.name for r in record] == ["raw", "top_k", "top_p", "temperature"]
    assert [r.kept for r in record][:2] == [6, 3]
    assert record[-1].top_probs[0] > record[0].top_probs[0]
    assert math.isclose(sum(record[1].top_probs), 1.0, rel_tol=1e-6)
    assert entropy_bits(torch.tensor([0.5, 0.5])) == pytest.approx(1.0)
    assert record[0].cut == [] and record[1].cut == [3, 4, 5]  # top_k 3 cut these of the model's top
    assert record[2].cut == [2] and record[2].kept == 2 and record[3].cut == []  # top_p 0.9: p(2) = 0.09


def test_the_chain_holds_the_history_it_is_told():
    params = SamplingParams(temperature=0, repetition_penalty=4.0, presence_penalty=1.0)
    logits = torch.tensor([3.0, 2.9, 2.0, 1.0])
    chain = SamplerChain.from_params(params, 4, prompt_ids=[1])
    assert chain.sample(logits).token_id == 0  # token 1 is in the prompt: 2.9 / 4
    chain.accept(0)
    chosen = chain.sample(logits)
    history = History.start([1], 4)
    history.add(0)
    assert chosen.logits.tolist() == Penalties(4.0, 1.0, 0.0, history).apply(logits).tolist()
    assert chosen.token_id == 2 and chosen.draw is None  # 0 and 1 are penalized now; nothing accepted twice
    assert chain.stages[0].history.generated_counts.tolist() == [1, 0, 0, 0]


def test_a_given_draw_is_used_and_leaves_the_stream_alone():
    logits = torch.randn(30, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(temperature=0.8, top_k=10, seed=42)
    given = SamplerChain.from_params(params, 30)
    for u in (0.0, 0.25, 0.5, 0.999):
        chosen = given.sample(logits, u=u)
        assert chosen.draw == u and chosen.token_id == pick(chosen.logits, u)
    untouched = SamplerChain.from_params(params, 30)
    assert [given.sample(logits).draw for _ in range(3)] == [untouched.sample(logits).draw for _ in range(3)]
    with pytest.raises(ValueError, match="a draw must be in \\[0, 1\\), got 1.5"):
        given.sample(logits, u=1.5)
    greedy = SamplerChain.from_params(SamplingParams(temperature=0), 30)
    chosen = greedy.sample(logits, u=0.99)
    assert chosen.token_id == int(logits.argmax()) and chosen.draw is None


def test_vocabulary_check_is_one_function():
    check_token_ids({3: 1.0}, 4)
    with pytest.raises(ValueError, match="logit_bias token id 4 is outside the vocabulary \\(0..3\\)"):
        check_token_ids({4: 1.0}, 4)
    with pytest.raises(ValueError, match="logit_bias token id 7 is outside"):
        SamplerChain.from_params(SamplingParams(logit_bias={7: 1.0}), 4)


def test_the_library_defaults_change_no_logit():
    """SamplingParams() samples from the model's own distribution: each stage at its default is the
    identity (checked by applying it, not by comparing the defaults with the table they come from),
    and so the chain builds none of them."""
    d = SamplingParams()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(50, generator=gen) * 3
    history = History.start(torch.randint(0, 50, (12,), generator=gen).tolist(), 50)
    history.add(7)
    for stage in (Penalties(d.repetition_penalty, d.presence_penalty, d.frequency_penalty, history), TopP(d.top_p),
                  MinP(d.min_p), Temperature(d.temperature), LogitBias(d.logit_bias, 50)):
        assert torch.equal(stage.apply(logits), logits), stage.name
    assert d.top_k == 0 and d.seed is None  # 0: no top-k cut; None: a fresh seed per generation
    assert SamplerChain.from_params(d, 50).stages == []


@pytest.mark.parametrize("name", ["temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                                  "presence_penalty", "frequency_penalty", "seed"])
def test_the_table_is_what_validate_enforces(name):
    bound = PARAMETERS[name]
    step = 1 if bound.integer else 1e-3
    edges = [(bound.low, not bound.low_open), (bound.low - step, False)]
    if bound.high != math.inf:
        edges += [(bound.high, not bound.high_open), (bound.high + step, False)]
    for value, ok in edges:
        value = int(value) if bound.integer else float(value)
        if ok:
            SamplingParams(**{name: value})
        else:
            with pytest.raises(ValueError, match=re.escape(f"{name} must be {bound.allowed()}, got {value!r}")):
                SamplingParams(**{name: value})


def test_bounds_as_pydantic_limits():
    assert PARAMETERS["top_p"].limits() == {"gt": 0.0, "le": 1.0}
    assert PARAMETERS["temperature"].limits() == {"ge": 0.0}  # no upper end
    assert PARAMETERS["seed"].limits() == {"ge": 0, "lt": 2**63}


def _walk(chain: SamplerChain, rows: list[torch.Tensor]) -> list[int]:
    tokens = []
    for row in rows:
        tokens.append(chain.sample(row).token_id)
        chain.accept(tokens[-1])
    return tokens


def test_the_chain_clones_and_resets_as_llama_cpps():
    """clone: an independent chain in this one's state (the penalties' history, the stream's place)
    that goes on as the original does; reset: back to the prompt and the seed."""
    params = SamplingParams(temperature=0.9, top_k=20, repetition_penalty=1.3, presence_penalty=0.5, seed=4)
    rows = [torch.randn(60, generator=torch.Generator().manual_seed(k)) * 3 for k in range(10)]
    chain = SamplerChain.from_params(params, 60, prompt_ids=[1, 2, 3])
    first = _walk(chain, rows[:5])
    copy = chain.clone()
    assert _walk(chain, rows[5:]) == _walk(copy, rows[5:])
    assert copy.stages[0].history.generated == chain.stages[0].history.generated
    chain.reset()
    assert chain.stages[0].history.generated == [] and _walk(chain, rows[:5]) == first


def test_repeat_last_n_narrows_the_penalties_to_the_last_tokens():
    """The window is over the prompt and the output together: repetition sees a prompt token only while
    it is among the last n; presence and frequency count the generated tokens in it."""
    history = History.start([0, 1], 6, last_n=3)
    for token in (2, 2, 3):
        history.add(token)
    assert history.seen_mask().tolist() == [False, False, True, True, False, False]  # 2, 2, 3: the prompt is out
    assert history.counts().tolist() == [0, 0, 2, 1, 0, 0]
    wide = History.start([0, 1], 6, last_n=4)
    wide.add(2)
    assert wide.seen_mask().tolist() == [True, True, True, False, False, False]
    logits = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert Penalties(2.0, 0.5, 0.0, history).apply(logits).tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert SamplerChain.from_params(SamplingParams(repetition_penalty=1.5, repeat_last_n=0), 6).stages == []  # 0: off
