"""decode(encode(s)) == s, pieces, and the incremental detokenizer."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nexttok.tokenizers.detokenizer import IncrementalDetokenizer
from nexttok.tokenizers.from_json import from_tokenizer_json
from nexttok.tokenizers.tokenizer import bytes_to_unicode


@settings(max_examples=400, deadline=None)
@given(text=st.text())
def test_roundtrip_real_gpt2(gpt2, text):
    assert gpt2.decode(gpt2.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab <|endoftext|>\n"))))
def test_roundtrip_with_special_tokens_in_text(gpt2, text):
    for allow in (True, False):
        assert gpt2.decode(gpt2.encode(text, allow_special=allow)) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_roundtrip_trained_llama3_style(variant_files, text):
    tok = _load(variant_files, "llama3")
    assert tok.decode(tok.encode(text)) == text


_LOADED: dict = {}


def _load(variant_files, name):
    if name not in _LOADED:
        _LOADED[name] = from_tokenizer_json(variant_files[name])
    return _LOADED[name]


def test_pieces_show_each_token(gpt2):
    ids = gpt2.encode(" unbelievable café")
    pieces = gpt2.pieces(ids)
    assert [p.id for p in pieces] == ids
    assert "".join(p.text for p in pieces) == " unbelievable café"
    split = gpt2.pieces(gpt2.encode("🎉"))  # 4 bytes over several tokens: each shows its bytes
    assert b"".join(p.bytes for p in split) == "🎉".encode()
    assert all("\\x" in p.text for p in split)


def test_skip_special(gpt2):
    ids = gpt2.encode("a<|endoftext|>b")
    assert gpt2.decode(ids) == "a<|endoftext|>b"
    assert gpt2.decode(ids, skip_special=True) == "ab"


def _byte_ids(tokenizer, data: bytes) -> list[int]:
    """One token per byte: the worst case for splitting characters."""
    table = bytes_to_unicode()
    return [tokenizer.token_to_id(table[b]) for b in data]


@settings(max_examples=300, deadline=None)
@given(text=st.text().filter(lambda t: "\ufffd" not in t))
def test_stream_never_emits_replacement_for_split_chars(gpt2, text):
    for ids in (gpt2.encode(text), _byte_ids(gpt2, text.encode())):
        detok = IncrementalDetokenizer(gpt2)
        emitted = ""
        for i in ids:
            delta = detok.add(i)
            assert "\ufffd" not in delta
            emitted += delta
            assert text.startswith(emitted)  # every prefix released is final text
        assert emitted + detok.flush() == text


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=40), cut=st.integers(min_value=0, max_value=40))
def test_stream_of_any_bytes_equals_decode(gpt2, data, cut):
    ids = _byte_ids(gpt2, data)
    for split in (ids, [*gpt2.encode("x"), *ids]):
        detok = IncrementalDetokenizer(gpt2)
        streamed = "".join(detok.add(i) for i in split[:cut]) + detok.add_many(split[cut:])
        assert streamed + detok.flush() == gpt2.decode(split)


def test_stream_every_split_point(gpt2):
    text = "naïve café 日本語 🎉👍🏽 done"
    ids = _byte_ids(gpt2, text.encode())
    for cut in range(len(ids) + 1):
        detok = IncrementalDetokenizer(gpt2)
        first = detok.add_many(ids[:cut])
        held = detok.pending_bytes
        rest = detok.add_many(ids[cut:])
        assert first + rest + detok.flush() == text
        assert text.encode().startswith(first.encode() + held)


def test_flush_replaces_incomplete_tail_and_resets(gpt2):
    detok = IncrementalDetokenizer(gpt2)
    ids = _byte_ids(gpt2, "é".encode())
    assert detok.add(ids[0]) == ""
    assert detok.pending_bytes == b"\xc3"
    assert detok.flush() == "\ufffd"
    assert detok.add_many(_byte_ids(gpt2, b"ok")) == "ok"


def test_stream_skip_special(gpt2):
    detok = IncrementalDetokenizer(gpt2, skip_special=True)
    assert detok.add_many(gpt2.encode("a<|endoftext|>b")) == "ab"
