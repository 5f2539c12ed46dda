"""Id-for-id parity with HF tokenizers (and tiktoken) on a 320 KB varied corpus."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus import chunks, corpus
from nexttok.tokenizers.from_json import from_tokenizer_json

VARIANTS = [
    "gpt2", "gpt2_prefix_space", "llama3", "qwen2", "smollm", "digit_runs_nfkc", "string_merges",
    *(f"split_{b}_{i}" for b in ("Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous")
      for i in (False, True)),
]


def _pair(variant_files, name):
    from tokenizers import Tokenizer as HFTokenizer

    path = variant_files[name]
    return from_tokenizer_json(path), HFTokenizer.from_file(str(path))


def _first_mismatch(ours: list[int], ref: list[int]) -> str:
    n = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b), min(len(ours), len(ref)))
    return f"first difference at token {n}: ours {ours[n:n + 8]} vs reference {ref[n:n + 8]}"


def test_corpus_is_large_and_varied():
    text = corpus()
    assert len(text.encode("utf-8")) >= 200_000
    for needle in ("def ", "é", "日", "\u3000", "\r\n", "<|endoftext|>", "I'll", "1,"):
        assert needle in text
    assert any(0x1F600 <= ord(c) <= 0x1F9FF for c in text)


@pytest.mark.parametrize("name", VARIANTS)
def test_chunks_match_hf(variant_files, name):
    ours, hf = _pair(variant_files, name)
    pieces = chunks(corpus())
    reference = [e.ids for e in hf.encode_batch(pieces, add_special_tokens=False)]
    for text, ref in zip(pieces, reference, strict=True):
        got = ours.encode(text)
        assert got == ref, _first_mismatch(got, ref)


@pytest.mark.parametrize("name", ["gpt2", "llama3", "qwen2", "smollm"])
def test_whole_corpus_matches_hf(variant_files, name):
    ours, hf = _pair(variant_files, name)
    text = corpus()
    ref = hf.encode(text, add_special_tokens=False).ids
    got = ours.encode(text)
    assert got == ref, _first_mismatch(got, ref)
    assert ours.decode(got) == hf.decode(ref, skip_special_tokens=False)


def test_post_processor_bos_matches_hf(variant_files):
    ours, hf = _pair(variant_files, "llama3")
    text = "Hello world, it's 2026."
    assert ours.encode(text, add_special=True) == hf.encode(text, add_special_tokens=True).ids
    assert ours.encode(text, add_special=True)[0] == ours.token_to_id("<|endoftext|>")


def test_real_gpt2_matches_hf_and_tiktoken(gpt2, hf_gpt2, tiktoken_gpt2):
    text = corpus()
    ours = gpt2.encode(text)
    ref = hf_gpt2.encode(text, add_special_tokens=False).ids
    assert ours == ref, _first_mismatch(ours, ref)
    tik = tiktoken_gpt2.encode(text, allowed_special="all")
    assert ours == tik, _first_mismatch(ours, tik)


def test_real_gpt2_known_ids(gpt2):
    assert gpt2.encode("The capital of France is Paris.") == [464, 3139, 286, 4881, 318, 6342, 13]
    assert gpt2.encode("<|endoftext|>") == [50256]
    assert gpt2.encode("<|endoftext|>", allow_special=False) == [27, 91, 437, 1659, 5239, 91, 29]


def test_allow_special_false_matches_tiktoken_plain_text(gpt2, tiktoken_gpt2):
    text = "a<|endoftext|>b <|endoftext|>"
    assert gpt2.encode(text, allow_special=False) == tiktoken_gpt2.encode(text, disallowed_special=())


@pytest.mark.parametrize("name", ["gpt2", "llama3", "qwen2", "smollm", "split_MergedWithNext_True"])
@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=60))
def test_arbitrary_text_matches_hf(variant_files, name, text):
    ours, hf = _pair_cached(variant_files, name)
    assert ours.encode(text) == hf.encode(text, add_special_tokens=False).ids


_PAIRS: dict = {}


def _pair_cached(variant_files, name):
    if name not in _PAIRS:
        _PAIRS[name] = _pair(variant_files, name)
    return _PAIRS[name]


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=60))
def test_arbitrary_text_matches_real_gpt2(gpt2, hf_gpt2, text):
    assert gpt2.encode(text) == hf_gpt2.encode(text, add_special_tokens=False).ids
