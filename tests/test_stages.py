"""The stages llama.cpp, llama-server and Ollama users reach for beyond the first six, each against an
independent reference in the same test: llama.cpp's rules written out plainly (llama_reference.py),
llama.cpp's own test vectors (tests/test-sampling.cpp), and HF's TypicalLogitsWarper for typical-p."""

from __future__ import annotations

import pytest
import torch

import llama_reference as ref
from nexttok.generation.sampling import SamplerChain, SamplingParams
from nexttok.generation.stages import NEG_INF, Uniforms


def _logits(probs) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float32).log()  # log(0) = -inf: cut from the start


def _random(seed: int, size: int = 200, scale: float = 3.0, cut: int = 0) -> torch.Tensor:
    """Random logits; `cut` of them already at -inf (as after an earlier filter)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(size, generator=gen) * scale
    if cut:
        logits[torch.randperm(size, generator=gen)[:cut]] = NEG_INF
    return logits


def _kept(logits: torch.Tensor) -> list[int]:
    return torch.nonzero(logits > NEG_INF).flatten().tolist()


def _ref_kept(values: list[float]) -> list[int]:
    return [i for i, x in enumerate(values) if x > NEG_INF]


def _chain(vocab: int = 200, **settings) -> SamplerChain:
    return SamplerChain.from_params(SamplingParams(**settings), vocab)


def _probs(logits: torch.Tensor) -> list[float]:
    return [round(p, 5) for p in logits.softmax(-1).tolist()]


class Fixed:
    """A random stream that always says u (XTC's chance in llama.cpp's vectors)."""

    def __init__(self, u: float):
        self.u = u

    def next(self, purpose: str = "draw") -> float:
        return self.u


# -- typical-p --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mass", [0.2, 0.5, 0.9, 0.99])
def test_typical_p_against_llama_cpp_and_hf(seed, mass):
    from transformers.generation.logits_process import TypicalLogitsWarper

    from nexttok.generation.stages import TypicalP

    logits = _random(seed, cut=60 if seed % 2 else 0)
    ours = TypicalP(mass).apply(logits)
    assert _kept(ours) == _ref_kept(ref.typical(logits.tolist(), mass))
    hf = TypicalLogitsWarper(mass)(torch.zeros(1, 1, dtype=torch.long), logits[None].clone())[0]
    torch.testing.assert_close(ours, hf)  # the kept logits untouched, the rest -inf


def test_typical_p_llama_cpp_vectors_and_it_may_cut_the_top_token():
    from nexttok.generation.stages import TypicalP

    assert _kept(TypicalP(0.5).apply(_logits([0.97, 0.01, 0.01, 0.01]))) == [0]
    assert _kept(TypicalP(0.5).apply(_logits([0.4, 0.2, 0.2, 0.2]))) == [1, 2, 3]
    assert _kept(TypicalP(0.3).apply(_logits([0.25] * 4))) == [0, 1] == _ref_kept(ref.typical([0.0] * 4, 0.3))
    # so it runs in a greedy chain too: temperature 0 takes the top of what typical-p kept
    chain = _chain(4, temperature=0, typical_p=0.5)
    assert [s.name for s in chain.stages] == ["typical_p"]
    assert chain.sample(_logits([0.4, 0.2, 0.2, 0.2])).token_id == 1
    assert _chain(4, typical_p=1.0).stages == []  # 1 = off: not built


# -- top-n-sigma ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [0.3, 1.0, 2.0])
def test_top_n_sigma_against_llama_cpp(seed, n):
    from nexttok.generation.stages import TopNSigma

    logits = _random(seed, cut=60 if seed % 2 else 0)
    ours = TopNSigma(n).apply(logits)
    expected = ref.top_n_sigma(logits.tolist(), n)
    assert _kept(ours) == _ref_kept(expected)
    torch.testing.assert_close(ours, torch.tensor(expected, dtype=torch.float32))
    assert _kept(TopNSigma(n).apply(logits / 0.4)) == _kept(ours)  # a cut on logits: temperature cannot move it


def test_top_n_sigma_llama_cpp_vectors_and_off():
    from nexttok.generation.stages import TopNSigma

    assert _probs(TopNSigma(1.0).apply(_logits([0.1, 0.2, 0.3, 0.4]))) == [0.0, 0.0, 0.42857, 0.57143]
    assert _kept(TopNSigma(3.0).apply(_logits([0.1, 0.2, 0.3, 0.4]))) == [0, 1, 2, 3]
    assert _chain(4, top_n_sigma=0.0).stages == [] and _chain(4, top_n_sigma=-1.0).stages == []  # llama.cpp's off
    assert _chain(4, temperature=0, top_n_sigma=1.0).stages == []  # it keeps the top token: a greedy chain skips it


# -- XTC --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("threshold", [0.05, 0.1, 0.2])
def test_xtc_against_llama_cpp_with_the_chance_from_the_seeded_stream(seed, threshold):
    """The chain's XTC takes each step's chance from the same seeded stream as the draw: the
    reference is handed the numbers of a stream with that seed."""
    chain = _chain(50, xtc_probability=0.5, xtc_threshold=threshold, seed=seed)
    stream, fired = Uniforms(seed), 0
    for step in range(30):
        row = _random(seed * 100 + step, size=50, scale=2.5)
        ours = chain.apply(row)
        expected = ref.xtc(row.tolist(), 0.5, threshold, stream.next())
        assert _kept(ours) == _ref_kept(expected), step
        fired += _kept(ours) != _kept(row)
    assert 0 < fired < 30


def test_xtc_llama_cpp_vectors():
    from nexttok.generation.stages import XTC

    probs = [0.4, 0.3, 0.2, 0.1]
    for threshold, kept in [(0.09, [3]), (0.19, [2, 3]), (0.29, [1, 2, 3]), (0.39, [0, 1, 2, 3])]:
        assert _kept(XTC(0.99, threshold, Fixed(0.0)).apply(_logits(probs))) == kept
    assert _kept(XTC(0.5, 0.09, Fixed(0.6)).apply(_logits(probs))) == [0, 1, 2, 3]  # not this step
    assert _chain(4, xtc_probability=0.5, xtc_threshold=0.6).stages == []  # > 0.5: llama.cpp's off
    greedy = _chain(4, temperature=0, xtc_probability=1.0, xtc_threshold=0.1, seed=0)
    assert greedy.sample(_logits(probs)).token_id == 3  # it cuts the top tokens: greedy takes what is left


# -- dynamic temperature ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("t,delta,exponent", [(0.8, 0.5, 1.0), (1.0, 1.5, 2.0), (0.3, 0.3, 0.5), (0.7, 0.0, 1.0)])
def test_dynamic_temperature_against_llama_cpp(seed, t, delta, exponent):
    from nexttok.generation.stages import Temperature

    logits = _random(seed, cut=60 if seed % 2 else 0)
    ours = Temperature(t, delta, exponent).apply(logits)
    expected = torch.tensor(ref.dynamic_temperature(logits.tolist(), t, delta, exponent), dtype=torch.float32)
    torch.testing.assert_close(ours, expected)


def test_dynamic_temperature_cools_sure_steps_and_heats_open_ones():
    from nexttok.generation.stages import Temperature

    stage = Temperature(1.0, 0.5, 1.0)
    sure, flat = _logits([0.97, 0.01, 0.01, 0.01]), torch.zeros(4)
    assert stage.apply(flat).tolist() == (flat / 1.5).tolist()  # entropy at its most: temperature + range
    assert float(stage.apply(sure).softmax(-1)[0]) > 0.97  # low entropy: below 1, sharper
    assert [s.name for s in _chain(4, dynatemp_range=0.5).stages] == ["temperature"]  # built at temperature 1


# -- Mirostat ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("seed", range(3))
def test_mirostat_against_llama_cpp_step_by_step(version, seed):
    """40 steps: the chain's token and what Mirostat kept equal llama.cpp's rules fed the chain's own
    draws, and mu follows, advanced by each accepted token."""
    vocab, tau, eta = 500, 3.0, 0.1
    chain = _chain(vocab, mirostat=version, mirostat_tau=tau, mirostat_eta=eta, temperature=0.8, top_k=40,
                   top_p=0.9, seed=seed)
    assert [s.name for s in chain.stages] == ["temperature", "mirostat"]  # as llama.cpp: the filters give way
    mu = 2 * tau
    for step in range(40):
        logits = _random(seed * 1000 + step, size=vocab, scale=2.0 + step % 3)
        chosen = chain.sample(logits)
        tempered = (logits / 0.8).tolist()
        if version == 1:
            token, mu, kept = ref.mirostat_v1(tempered, mu, tau, eta, vocab, chosen.draw)
        else:
            token, mu, kept = ref.mirostat_v2(tempered, mu, tau, eta, chosen.draw)
        assert chosen.token_id == token and _kept(chosen.logits) == _ref_kept(kept), step
        chain.accept(chosen.token_id)
        assert chain.stages[-1].mu == pytest.approx(mu, abs=1e-4)


def _walk(chain: SamplerChain, rows: list[torch.Tensor]) -> list[int]:
    """Sample and accept a token per row."""
    tokens = []
    for row in rows:
        tokens.append(chain.sample(row).token_id)
        chain.accept(tokens[-1])
    return tokens


def test_mirostat_state_is_cloned_and_reset():
    rows = [_random(k, size=300) for k in range(12)]
    chain = _chain(300, mirostat=2, mirostat_tau=4.0, seed=3)
    first = _walk(chain, rows[:6])
    copy = chain.clone()
    assert _walk(chain, rows[6:]) == _walk(copy, rows[6:])  # the clone goes on as the chain does
    assert copy.stages[-1].mu == chain.stages[-1].mu != 8.0
    chain.reset()
    assert chain.stages[-1].mu == 8.0 and _walk(chain, rows[:6]) == first  # and the stream back to its seed
    assert _chain(300, temperature=0, mirostat=1).stages == []  # greedy: nothing to steer


# -- DRY --------------------------------------------------------------------------------------------

# llama.cpp's test_dry cases: probabilities, tokens seen, expected probabilities, multiplier, base,
# allowed length, last n, breakers (token sequences)
DRY_VECTORS = [
    ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, []),
    ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, [[3]]),
    ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, []),
]


@pytest.mark.parametrize("probs,seen,expected,multiplier,base,allowed,last_n,breakers", DRY_VECTORS)
def test_dry_llama_cpp_vectors(probs, seen, expected, multiplier, base, allowed, last_n, breakers):
    from nexttok.generation.stages.dry import DRY, TokenBreakers

    stage = DRY(multiplier, base, allowed, last_n, TokenBreakers(breakers))
    for token in seen:
        stage.accept(token)
    assert stage.apply(_logits(probs)).softmax(-1).tolist() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("seed", range(24))
def test_dry_against_its_rules_written_plainly(seed):
    from nexttok.generation.stages.dry import DRY, TokenBreakers

    gen = torch.Generator().manual_seed(seed)
    alphabet = 4 + seed % 4
    context = torch.randint(0, alphabet, (int(torch.randint(5, 90, (), generator=gen)),), generator=gen).tolist()
    breakers = [torch.randint(0, alphabet, (int(n),), generator=gen).tolist()
                for n in torch.randint(1, 4, (seed % 3,), generator=gen)]
    multiplier, base = 0.5 + seed % 3, [1.1, 1.75, 3.0][seed % 3]
    allowed, last_n = seed % 4, [-1, 12, 64][seed % 3]
    stage = DRY(multiplier, base, allowed, last_n, TokenBreakers(breakers), prompt_ids=context[:7])
    for token in context[7:]:
        stage.accept(token)
    logits = _random(seed, size=alphabet + 2)
    table: dict[int, list[tuple]] = {}
    for sequence in breakers:
        table.setdefault(sequence[0], []).append(tuple(sequence[1:]))
    expected = ref.dry(logits.tolist(), context, multiplier, base, allowed, last_n, table)
    torch.testing.assert_close(stage.apply(logits), torch.tensor(expected, dtype=torch.float32))


def test_dry_text_breakers_are_llama_cpps_token_sequences(gpt2):
    """Breakers as text become, token by token, the sequences llama.cpp's
    get_overlapping_token_sequences finds over the whole vocabulary."""
    from nexttok.generation.stages.dry import TextBreakers

    words = [gpt2.decode_bytes([i]) for i in range(gpt2.vocab_size)]
    tokenize = lambda rest: gpt2.encode(rest.decode("utf-8"), allow_special=False)  # noqa: E731
    others = torch.randint(0, gpt2.vocab_size, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    for breaker in ["\n", ":", "User:", " the end"]:
        expected = ref.breaker_sequences(words, breaker.encode(), tokenize)
        ours = TextBreakers([breaker], gpt2)
        assert len(expected) > 1
        for token in [*expected, *others]:
            assert sorted(ours.tails(token)) == sorted(expected.get(token, [])), (breaker, token)


def test_dry_in_a_chain_with_the_tokenizer(gpt2):
    """' a b c a b': DRY makes ' c' (what would extend the repeat of ' a b') costly; a breaker inside
    the repeat (' a b c a\\n b') leaves it too short to count."""
    ids = gpt2.encode(" a b c a b")
    logits = torch.zeros(gpt2.vocab_size)
    c = gpt2.encode(" c")[0]
    params = SamplingParams(dry_multiplier=1.0, dry_allowed_length=2, seed=0)
    chain = SamplerChain.from_params(params, gpt2.vocab_size, ids, tokenizer=gpt2)
    assert [s.name for s in chain.stages] == ["dry"] and float(chain.apply(logits)[c]) == pytest.approx(-1.0)
    broken = SamplerChain.from_params(params, gpt2.vocab_size, gpt2.encode(" a b c a\n b"), tokenizer=gpt2)
    assert float(broken.apply(logits)[c]) == 0.0
    with pytest.raises(ValueError, match="DRY's sequence breakers are text: the chain needs the model's tokenizer"):
        SamplerChain.from_params(params, gpt2.vocab_size, ids)


# -- every stage through the faces: the chain, the server, the explainer -----------------------------


def test_the_default_order_is_llama_cpps_and_mirostat_runs_last():
    from nexttok.generation.stages import DEFAULT_ORDER

    assert list(DEFAULT_ORDER) == ["penalties", "dry", "logit_bias", "top_n_sigma", "top_k", "typical_p", "top_p",
                                   "min_p", "xtc", "temperature"]
    params = dict(top_n_sigma=2.0, top_k=40, typical_p=0.9, top_p=0.9, min_p=0.01, xtc_probability=0.5,
                  temperature=0.7, dynatemp_range=0.2, presence_penalty=0.5)
    assert [s.name for s in _chain(**params).stages] == ["penalties", "top_n_sigma", "top_k", "typical_p", "top_p",
                                                        "min_p", "xtc", "temperature"]
    with_mirostat = _chain(**params, mirostat=2, logit_bias={3: 1.0})
    assert [s.name for s in with_mirostat.stages] == ["logit_bias", "temperature", "mirostat"]
    assert with_mirostat.stages[1].range == 0  # llama.cpp: plain temperature before Mirostat


@pytest.mark.parametrize("seed", range(3))
def test_the_new_filters_after_top_k_run_on_its_kept_logits_as_on_the_vocabulary(seed):
    """Top-n-sigma, typical-p, XTC and dynamic temperature may run on top-k's kept logits alone: the
    compacted path gives the rows and picks the stage-by-stage path (the explainer's) gives."""
    settings = dict(top_k=40, typical_p=0.9, xtc_probability=0.7, xtc_threshold=0.05, temperature=0.9,
                    dynatemp_range=0.4, seed=seed, order=["top_k", "typical_p", "top_n_sigma", "xtc", "temperature"])
    compact, stepwise = _chain(5000, **settings, top_n_sigma=1.5), _chain(5000, **settings, top_n_sigma=1.5)
    for step in range(15):
        logits = _random(seed * 50 + step, size=5000, scale=2.5)
        ours, theirs = compact.sample(logits), stepwise.sample(logits, record=True)
        torch.testing.assert_close(ours.logits, theirs.logits)
        assert ours.token_id == theirs.token_id and ours.draw == theirs.draw


def test_a_stage_names_what_it_did_for_the_page():
    """The chain's records (what the page's chain view shows): the tokens a stage cut, the logits a
    penalty moved, and the stage's own note (XTC's chance, the dynamic temperature, Mirostat's mu)."""
    logits = torch.tensor([3.0, 2.5, 2.0, 1.0, 0.5, 0.0])
    chain = SamplerChain.from_params(SamplingParams(presence_penalty=1.0, xtc_probability=1.0, xtc_threshold=0.1,
                                                    dynatemp_range=0.5, seed=0), 6, prompt_ids=[4])
    chain.accept(1)
    records = chain.sample(logits, record=True).stages
    assert [r.name for r in records] == ["raw", "penalties", "xtc", "temperature"]
    assert records[1].shifted == [(1, -1.0)] and records[1].cut == []
    assert records[2].cut == [0, 2] and records[2].note.endswith("cut 2 top tokens")  # 0 and 2 above 0.1, 1 is the least
    assert records[3].note.startswith("entropy ") and "T = " in records[3].note
    mirostat = _chain(6, mirostat=2, seed=0).sample(logits, record=True).stages[-1]
    assert mirostat.name == "mirostat" and mirostat.note.startswith("mu 10.000: ")


SERVED = {"temperature": 0.9, "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 1,
          "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n", "."], "xtc_probability": 0.5,
          "xtc_threshold": 0.1, "top_n_sigma": 2.0, "typical_p": 0.9, "dynatemp_range": 0.3, "dynatemp_exponent": 1.5,
          "repeat_last_n": 32, "presence_penalty": 0.2}


@pytest.mark.parametrize("fields", [SERVED, {"temperature": 0.8, "mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2},
                                    {"mirostat": 1, "mirostat_tau": 4.0}], ids=["llama-server", "mirostat2", "mirostat1"])
def test_the_server_takes_llama_servers_fields(server, served, fields):
    import httpx

    from nexttok.generation.loop import generate

    body = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 12, "seed": 5, **fields}
    text = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
    params = SamplingParams(**fields, seed=5)
    assert text == generate(served.model, served.tokenizer, "The quick brown fox", params, max_tokens=12).text


@pytest.mark.parametrize("field,value", [("dry_multiplier", -1), ("dry_base", 0.5), ("dry_allowed_length", 1.5),
                                         ("dry_penalty_last_n", -2), ("dry_sequence_breakers", [""]),
                                         ("dry_sequence_breakers", "\n"), ("xtc_probability", 1.5),
                                         ("xtc_threshold", -0.1), ("top_n_sigma", -2), ("typical_p", 0),
                                         ("mirostat", 3), ("mirostat_tau", -1), ("mirostat_eta", 2),
                                         ("dynatemp_range", -0.5), ("repeat_last_n", -3)])
def test_a_bad_stage_field_is_a_400_naming_it(server, field, value):
    import httpx

    response = httpx.post(server.url + "/v1/completions", timeout=60,
                          json={"model": "tiny", "prompt": "x", "max_tokens": 2, field: value})
    assert response.status_code == 400 and response.json()["error"]["param"] == field, response.text


@pytest.mark.parametrize("changes,message", [
    ({"dry_multiplier": -1.0}, "dry_multiplier must be a number >= 0, got -1.0"),
    ({"dry_base": 0.9}, "dry_base must be a number >= 1, got 0.9"),
    ({"dry_penalty_last_n": -2}, "dry_penalty_last_n must be an integer >= -1, got -2"),
    ({"dry_sequence_breakers": ["\n", ""]}, "dry_sequence_breakers\\[1\\] must be 1 to 40 characters, got ''"),
    ({"dry_sequence_breakers": "\n"}, "dry_sequence_breakers must be a list of at most 16 strings"),
    ({"xtc_probability": 2.0}, "xtc_probability must be in \\[0, 1\\], got 2.0"),
    ({"top_n_sigma": -1.5}, "top_n_sigma must be a number >= -1, got -1.5"),
    ({"typical_p": 0.0}, "typical_p must be in \\(0, 1\\], got 0.0"),
    ({"mirostat": 3}, "mirostat must be an integer in \\[0, 2\\], got 3"),
    ({"mirostat_eta": float("nan")}, "mirostat_eta must be in \\[0, 1\\], got nan"),
    ({"dynatemp_exponent": -1.0}, "dynatemp_exponent must be a number >= 0, got -1.0"),
])
def test_bad_values_are_one_line_errors_naming_the_field(changes, message):
    from nexttok.errors import InvalidParameter

    with pytest.raises(InvalidParameter, match=message) as caught:
        SamplingParams(**changes)
    assert caught.value.param == next(iter(changes)) and "\n" not in str(caught.value)
