"""Speculative decoding: greedy tokens equal plain decoding's, sampled tokens follow the model's
distribution, and the drafters propose what they should.

References: plain decoding (`generate`) on the same float32 model, the sampler chain's own
distribution (softmax of its final logits) for a chi-square test, and hand-made contexts."""

from __future__ import annotations

import re

import pytest
import torch

from nexttok.checkpoints.loading import load_checkpoint, load_model
from nexttok.cli import main
from nexttok.generation.loop import Generation, generate
from nexttok.generation.sampling import SamplingParams
from nexttok.generation.speculative import ModelDrafter, NgramDrafter, Rounds, speculative_stream, verify
from nexttok.generation.trace import read_trace

PROMPTS = [
    "The capital of France is",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "one two three four one two three four one two",
    "Copy: the quick brown fox. Copy: the quick",
    "a b c d e f g a b c d e f g a b",
    "<html><body><p>Hi</p></body></html>\n<html><body>",
    "1, 2, 3, 4, 5, 6, 7, 8, 9,",
    "Once upon a time there was a cat. Once upon a time",
    "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [",
    "red green blue red green blue red",
]
GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def target(chat_model_dir):
    return load_checkpoint(chat_model_dir)


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory, gpt2_dir):
    """Another tiny model over the same GPT-2 tokenizer, other weights."""
    from tiny_models import write_tiny_with_gpt2_tokenizer

    directory = tmp_path_factory.mktemp("draft")
    write_tiny_with_gpt2_tokenizer("llama_long_context", directory, gpt2_dir, seed=3)
    return directory


@pytest.mark.parametrize("drafter_kind", ["ngram", "model", "itself"])
def test_greedy_tokens_equal_plain_decoding(target, chat_model_dir, drafter_kind):
    model, tokenizer = target.model, target.tokenizer
    total = Rounds()
    for prompt in PROMPTS:
        drafter = {"ngram": lambda: NgramDrafter(),
                   "model": lambda: ModelDrafter(load_model(chat_model_dir, dtype="int8")),  # a cheaper copy
                   "itself": lambda: ModelDrafter(model)}[drafter_kind]()
        plain = generate(model, tokenizer, prompt, GREEDY, max_tokens=64, stop_token_ids=[])
        rounds = Rounds()
        steps = list(speculative_stream(model, tokenizer, prompt, GREEDY, drafter, k=4, rounds=rounds,
                                        max_tokens=64, stop_token_ids=[]))
        assert [s.token_id for s in steps] == plain.token_ids, prompt
        assert [s.logprob for s in steps] == pytest.approx([s.logprob for s in plain.steps], abs=1e-4)
        assert "".join(s.text for s in steps) == plain.text
        for field in ("drafted", "accepted", "forwards", "tokens"):
            setattr(total, field, getattr(total, field) + getattr(rounds, field))
    assert total.tokens == len(PROMPTS) * 63 and total.forwards < total.tokens  # fewer passes than tokens
    if drafter_kind == "itself":  # the model's own greedy guesses: every one is right
        assert total.accepted == total.drafted and total.tokens_per_forward > 4
    else:
        assert 0 < total.accepted <= total.drafted


@pytest.mark.parametrize("name", ["qwen3_moe", "gpt_oss"])
def test_greedy_speculation_on_a_mixture_of_experts_equals_plain_decoding(tmp_path, name):
    """A verify pass routes its k + 1 rows through the experts together (grouped by expert), a plain
    step one row: the same tokens (gpt-oss: sinks and sliding windows over the drafted rows too)."""
    from tiny_models import write_tiny, write_tiny_tokenizer

    write_tiny(name, tmp_path)
    write_tiny_tokenizer(tmp_path)
    checkpoint = load_checkpoint(tmp_path)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    total = Rounds()
    for prompt in PROMPTS[:5]:
        plain = generate(model, tokenizer, prompt, GREEDY, max_tokens=32, stop_token_ids=[])
        steps = list(speculative_stream(model, tokenizer, prompt, GREEDY, NgramDrafter(), k=4, rounds=total,
                                        max_tokens=32, stop_token_ids=[]))
        assert [s.token_id for s in steps] == plain.token_ids, prompt
        assert [s.logprob for s in steps] == pytest.approx([s.logprob for s in plain.steps], abs=1e-4)
    assert total.drafted > 0


def test_a_draw_at_a_drafted_position_follows_the_models_distribution(target):
    """The accept/reject rule (take the draft with probability p(draft), else draw from p without
    it) leaves each token's frequency at p: chi-square over 20,000 draws, with top-k cutting most
    of the vocabulary, for a likely and an unlikely draft, and one top-k cut (p = 0: always refused)."""
    model, tokenizer = target.model, target.tokenizer
    params = SamplingParams(temperature=1.3, top_k=6, seed=11)
    ids = tokenizer.encode("The capital of France is", add_special=True)
    with torch.inference_mode():
        logits = model(torch.tensor([ids]))[0, -1].float()
    generation = Generation(model.config, tokenizer, ids, params)
    p = generation.chain.apply(logits).softmax(-1)
    kept = torch.nonzero(p > 0).flatten().tolist()
    assert len(kept) == 6
    cut = int(torch.nonzero(p == 0)[0])
    for proposed in (max(kept, key=lambda i: p[i]), min(kept, key=lambda i: p[i]), cut):
        n = 20_000
        counts = torch.zeros_like(p)
        for _ in range(n):
            counts[verify(generation, logits, proposed).token_id] += 1
        assert counts.sum() == counts[kept].sum()  # never a token the chain cut
        expected = n * p[kept]
        chi2 = float((((counts[kept] - expected) ** 2) / expected).sum())
        assert chi2 < 20.5, f"chi-square {chi2:.1f} over 5 degrees of freedom (p < 0.001 would fail)"


def test_ngram_drafter_proposes_what_followed_the_latest_match():
    d = NgramDrafter()
    assert d.propose([1, 2, 3, 9, 1, 2], 2) == [3, 9]
    assert d.propose([5, 1, 2, 7, 1, 2, 8, 1, 2], 3) == [8, 1, 2]  # the latest of two matches
    assert d.propose([4, 1, 2, 3, 9, 9, 2, 3], 2) == [9, 9]  # the longest match (2, 3) before (3)
    assert d.propose([1, 2, 3], 4) == []  # nothing repeats
    assert d.propose([7, 7], 5) == [7]


def test_run_speculative_prints_acceptance_and_traces_draft_marks(chat_model_dir, draft_model, tmp_path, capsys):
    path = tmp_path / "spec.jsonl"
    assert main(["run", str(chat_model_dir), PROMPTS[2], "--temperature", "0", "--max-tokens", "24",
                 "--speculative", "ngram", "--trace", str(path)]) == 0
    out = capsys.readouterr()
    plain = generate(load_checkpoint(chat_model_dir).model, load_checkpoint(chat_model_dir).tokenizer, PROMPTS[2],
                     GREEDY, max_tokens=24)
    assert out.out.rstrip("\n") == plain.text
    trace = read_trace(path)
    marks = [s["draft"] for s in trace.steps]
    accepted = sum(1 for m in marks if m and m["accepted"])
    drafted = sum(1 for m in marks if m) + 0
    assert f"speculative (ngram): {accepted} of" in out.err and trace.header["runtime"]["speculative"] == {
        "drafter": "ngram", "draft_tokens": 5}
    assert marks[0] is None and drafted >= accepted > 0
    # the speed-up is the run's own decode rate over plain steps timed after it, as printed
    err = " ".join(out.err.split())  # rich wraps long lines
    rate = float(re.search(r"decode ([0-9.]+) tokens/s", err).group(1))
    ratio, plain, steps, start = re.search(
        r"speed-up ([0-9.]+)x over plain decoding \(([0-9.]+) tokens/s: (\d+) steps timed from token (\d+)\)",
        err).groups()
    assert float(plain) > 0 and int(steps) == 8
    assert int(start) == len(trace.prompt_ids) + len(trace.steps) // 2
    assert float(ratio) == pytest.approx(rate / float(plain), rel=0.01, abs=0.01)
    for step, mark in zip(trace.steps, marks, strict=True):
        if mark is not None:  # an accepted draft is the step's token; a refused one is not
            assert (mark["id"] == step["id"]) == mark["accepted"]
    assert main(["run", str(chat_model_dir), "hi", "--speculative", str(draft_model), "--max-tokens", "4"]) == 0
    assert main(["run", str(chat_model_dir), "hi", "--speculative", "ngram", "--no-cache"]) == 2
    assert "--speculative verifies drafts through the KV cache" in capsys.readouterr().err
