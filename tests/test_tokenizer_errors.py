"""Bad files and bad input get clear errors that name what was wrong."""

from __future__ import annotations

import json

import pytest

from nexttok.checkpoints.sources import load_tokenizer
from nexttok.tokenizers.from_json import from_directory, from_tokenizer_json, from_vocab_merges
from nexttok.tokenizers.tokenizer import TokenizerError


def _write(tmp_path, data, name="tokenizer.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def _mutated(trained_json, **changes):
    data = json.loads(json.dumps(trained_json))
    for dotted, value in changes.items():
        target = data
        *parents, last = dotted.split("__")
        for key in parents:
            target = target[key]
        target[last] = value
    return data


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json not found"):
        from_tokenizer_json(tmp_path / "tokenizer.json")


def test_empty_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer in .*expected tokenizer.json"):
        from_directory(tmp_path)


def test_path_that_does_not_exist():
    with pytest.raises(FileNotFoundError, match="no such file or directory: ./nowhere"):
        load_tokenizer("./nowhere")


@pytest.mark.parametrize("text,message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ("{}", "no 'model' object"),
])
def test_malformed_json(tmp_path, text, message):
    with pytest.raises(TokenizerError, match=message):
        from_tokenizer_json(_write(tmp_path, text))


def test_not_utf8(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(TokenizerError, match="not UTF-8"):
        from_tokenizer_json(path)


@pytest.mark.parametrize("changes,message", [
    ({"model__type": "WordPiece"}, "model type 'WordPiece' is not supported"),
    ({"model__continuing_subword_prefix": "##"}, "continuing_subword_prefix"),
    ({"model__dropout": 0.1}, "dropout"),
    ({"model__whole_words": "("}, "BPE whole_words '\\(' is not a regex"),
    ({"model__vocab": {}}, "vocab must be a non-empty object"),
    ({"model__vocab": {"a": -1}}, "vocab entry 'a' has id -1"),
    ({"model__vocab": {"a": "x"}}, "vocab entry 'a' has id 'x'"),
    ({"model__merges": "a b"}, "merges must be a list"),
    ({"model__merges": [["a"]]}, "merge #0 .* is not a pair"),
    ({"model__merges": [["zz", "qq"]]}, "merge #0 'zz' \\+ 'qq' makes 'zzqq', which is not in the vocab"),
    ({"pre_tokenizer": None}, "a ByteLevel decoder needs a ByteLevel pre-tokenizer"),
    ({"pre_tokenizer": {"type": "Metaspace"}}, "a ByteLevel decoder needs a ByteLevel pre-tokenizer"),
    ({"pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "sometimes"}, "decoder": None},
     "prepend_scheme 'sometimes' is not one of always, first, never"),
    ({"pre_tokenizer": {"type": "Whitespace"}}, "pre_tokenizer type 'Whitespace' is not supported"),
    ({"pre_tokenizer": {"type": "Metaspace"}, "decoder": None}, "decoder is null"),
    ({"pre_tokenizer": {"type": "Metaspace"}, "decoder": {"type": "CTC"}}, "decoder type 'CTC' is not supported"),
    ({"pre_tokenizer": {"type": "Metaspace"}, "decoder": {"type": "Sequence", "decoders": [
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 0, "stop": 1}]}}, "last characters"),
    ({"normalizer": {"type": "Replace", "pattern": {}, "content": "x"}}, "Replace normalizer needs a pattern"),
    ({"normalizer": {"type": "Prepend"}}, "Prepend normalizer needs a string 'prepend'"),
    ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated"}},
     "does not compile"),
    ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways"}},
     "Split behavior 'Sideways'"),
    ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Isolated"}},
     "a ByteLevel decoder needs a ByteLevel pre-tokenizer"),
    ({"decoder": {"type": "WordPiece"}}, "decoder 'WordPiece' does not fit a byte-level BPE"),
    ({"normalizer": {"type": "BertNormalizer"}}, "normalizer type 'BertNormalizer'"),
    ({"post_processor": {"type": "RobertaProcessing"}}, "post_processor type 'RobertaProcessing'"),
    ({"added_tokens": [{"id": 3}]}, "malformed added_tokens"),
])
def test_malformed_tokenizer_json(tmp_path, trained_json, changes, message):
    with pytest.raises(TokenizerError, match=message):
        from_tokenizer_json(_write(tmp_path, _mutated(trained_json, **changes)))


def test_vocab_merges_errors(tmp_path, gpt2_dir):
    vocab = gpt2_dir / "encoder.json"
    with pytest.raises(FileNotFoundError, match="merges file not found"):
        from_vocab_merges(vocab, tmp_path / "merges.txt")
    bad = _write(tmp_path, "#version: 0.2\nĠ t\nonlyone\n", "merges.txt")
    with pytest.raises(TokenizerError, match="merge #1 'onlyone' is not a pair"):
        from_vocab_merges(vocab, bad)


def test_vocab_merges_from_directory_names(tmp_path, gpt2_dir, gpt2):
    (tmp_path / "vocab.json").write_bytes((gpt2_dir / "encoder.json").read_bytes())
    (tmp_path / "merges.txt").write_bytes((gpt2_dir / "vocab.bpe").read_bytes())
    tok = load_tokenizer(tmp_path)
    assert tok.encode("Hello there<|endoftext|>") == gpt2.encode("Hello there<|endoftext|>")


def test_encode_rejects_bad_input(gpt2):
    with pytest.raises(TypeError, match="text must be str, got bytes"):
        gpt2.encode(b"abc")
    with pytest.raises(ValueError, match="lone surrogate '\\\\ud800' at index 1"):
        gpt2.encode("a\ud800b")


@pytest.mark.parametrize("ids,message", [
    ([-1], "token id -1 is not in the vocabulary"),
    ([50257], "token id 50257 is not in the vocabulary \\(valid: 0..50256\\)"),
])
def test_decode_rejects_bad_ids(gpt2, ids, message):
    with pytest.raises(ValueError, match=message):
        gpt2.decode(ids)


def test_decode_rejects_non_int(gpt2):
    with pytest.raises(TypeError, match="token id must be int, got str"):
        gpt2.decode(["1"])


def test_unknown_piece_without_unk_is_dropped_as_in_hf(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    data = {
        "version": "1.0", "added_tokens": [], "normalizer": None, "post_processor": None,
        "truncation": None, "padding": None,
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
        "pre_tokenizer": byte_level, "decoder": byte_level,
    }
    path = _write(tmp_path, data)
    tok, hf = from_tokenizer_json(path), HFTokenizer.from_file(str(path))
    for text in ("abab", "c", "acb", "a c b"):
        assert tok.encode(text) == hf.encode(text).ids
    assert tok.encode("acb") == [2]  # the unknown "c" is gone before merging, as in HF
