"""Reading HF's tokenizer files into a Tokenizer: tokenizer.json (BPE model, byte-level or with
byte fallback; pre-tokenizers, normalizers, decoder, added tokens, post-processor), or GPT-2's
vocab.json + merges.txt (a.k.a. encoder.json + vocab.bpe). Anything nexttok does not implement is
refused with a TokenizerError that names it, never silently approximated.
"""

from __future__ import annotations

import json
from pathlib import Path

import regex

from nexttok.tokenizers.decoders import decoder_from_json
from nexttok.tokenizers.normalizers import normalizer_from_json
from nexttok.tokenizers.pre_tokenizers import (
    METASPACE,
    SPLIT_BEHAVIORS,
    PreTokenizer,
    byte_level,
    chain,
    digits,
    metaspace,
    regex_split,
)
from nexttok.tokenizers.tokenizer import AddedToken, Symbols, Tokenizer, TokenizerError

_PRE_TOKENIZERS = "ByteLevel, Metaspace, Split, Digits, Sequence"


def _pretokenizer_from_json(spec: dict | None) -> tuple[PreTokenizer | None, bool]:
    """Build the pre-tokenizer (None: the text is one word); the bool says whether a ByteLevel
    stage was present (the symbols are then bytes as GPT-2's printable characters)."""
    if spec is None:
        return None, False
    if not isinstance(spec, dict):
        raise TokenizerError(f"pre_tokenizer must be an object or null, got {spec!r}")
    kind = spec.get("type")
    if kind == "Sequence":
        built = [_pretokenizer_from_json(s) for s in spec.get("pretokenizers", [])]
        if not built:
            raise TokenizerError("pre_tokenizer Sequence is empty")
        return chain([b[0] for b in built if b[0] is not None]), any(b[1] for b in built)
    if kind == "ByteLevel":
        return byte_level(spec.get("add_prefix_space", False), spec.get("use_regex", True)), True
    if kind == "Split":
        pattern = spec.get("pattern", {})
        if "Regex" in pattern:
            source = pattern["Regex"]
        elif "String" in pattern:
            source = regex.escape(pattern["String"])
        else:
            raise TokenizerError(f"Split pre_tokenizer has no pattern: {spec!r}")
        behavior = spec.get("behavior", "Isolated")
        if behavior not in SPLIT_BEHAVIORS:
            raise TokenizerError(f"Split behavior {behavior!r} is not one of {', '.join(SPLIT_BEHAVIORS)}")
        try:
            return regex_split(source, behavior, spec.get("invert", False)), False
        except regex.error as e:
            raise TokenizerError(f"Split pre_tokenizer pattern {source!r} does not compile: {e}") from e
    if kind == "Digits":
        return digits(spec.get("individual_digits", False)), False
    if kind == "Metaspace":
        return _metaspace_from_json(spec), False
    raise TokenizerError(f"pre_tokenizer type {kind!r} is not supported (supported: {_PRE_TOKENIZERS})")


def _metaspace_from_json(spec: dict) -> PreTokenizer:
    """Metaspace, in today's form (prepend_scheme) or the older one (add_prefix_space)."""
    replacement = spec.get("replacement", METASPACE)
    if not (isinstance(replacement, str) and len(replacement) == 1):
        raise TokenizerError(f"Metaspace replacement must be one character, got {replacement!r}")
    scheme = spec.get("prepend_scheme") or ("always" if spec.get("add_prefix_space", True) else "never")
    try:
        return metaspace(replacement, scheme, bool(spec.get("split", True)))
    except ValueError as e:
        raise TokenizerError(str(e)) from None


def _template_from_json(spec: dict | None) -> tuple[list[int], list[int]]:
    """Ids a TemplateProcessing post-processor puts before and after a single sequence."""
    if spec is None or spec.get("type") in ("ByteLevel", None):
        return [], []
    if spec.get("type") == "Sequence":
        found = [_template_from_json(p) for p in spec.get("processors", [])]
        prefix = [i for p, _ in found for i in p]
        return prefix, [i for _, s in found for i in s]
    if spec.get("type") != "TemplateProcessing":
        raise TokenizerError(f"post_processor type {spec.get('type')!r} is not supported")
    specials = spec.get("special_tokens", {})
    prefix: list[int] = []
    suffix: list[int] = []
    side = prefix
    for item in spec.get("single", []):
        if "Sequence" in item:
            side = suffix
        elif "SpecialToken" in item:
            name = item["SpecialToken"]["id"]
            if name not in specials:
                raise TokenizerError(f"post_processor names special token {name!r} it does not define")
            side.extend(specials[name]["ids"])
    return prefix, suffix


def _read_json(path: Path, what: str):
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path}") from None
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{what} {path} is not UTF-8 text: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{what} {path} is not valid JSON: {e}") from None


def _check_vocab(vocab, where: str) -> dict[str, int]:
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"{where}: vocab must be a non-empty object of token -> id")
    for token, i in vocab.items():
        if type(i) is not int or i < 0:
            raise TokenizerError(f"{where}: vocab entry {token!r} has id {i!r}, expected an int >= 0")
    return vocab


def _parse_merges(entries, where: str) -> list[tuple[str, str]]:
    """Merges as "a b" strings (older files) or [a, b] pairs.

    ["Ġ t", ["h", "e"]] -> [("Ġ", "t"), ("h", "e")]
    """
    if not isinstance(entries, list):
        raise TokenizerError(f"{where}: merges must be a list")
    merges = []
    for n, entry in enumerate(entries):
        pair = entry.split(" ") if type(entry) is str else entry
        if type(pair) is list and len(pair) == 2:
            a, b = pair
            if type(a) is str and type(b) is str and a and b:
                merges.append((a, b))
                continue
        raise TokenizerError(f"{where}: merge #{n} {entry!r} is not a pair of two tokens")
    return merges


def _check_bpe_model(model, where: str) -> None:
    if not isinstance(model, dict):
        raise TokenizerError(f"{where}: no 'model' object")
    if model.get("type", "BPE") != "BPE":
        raise TokenizerError(f"{where}: model type {model.get('type')!r} is not supported (only BPE)")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise TokenizerError(f"{where}: BPE {key}={model[key]!r} is not supported")
    if model.get("dropout"):
        raise TokenizerError(f"{where}: BPE dropout={model['dropout']!r} is not supported at inference")


def from_tokenizer_json(path: str | Path) -> Tokenizer:
    """Load an HF tokenizer.json (a BPE model: byte-level, or SentencePiece-style)."""
    path = Path(path)
    return tokenizer_from_json(_read_json(path, "tokenizer.json"), str(path))


def tokenizer_from_json(data, where: str = "tokenizer.json") -> Tokenizer:
    """A Tokenizer from the parsed content of a tokenizer.json; `where` names it in errors."""
    if not isinstance(data, dict):
        raise TokenizerError(f"{where}: expected a JSON object at the top level")
    model = data.get("model")
    _check_bpe_model(model, where)
    try:
        pre_tokenizer, is_byte_level = _pretokenizer_from_json(data.get("pre_tokenizer"))
        decoder = decoder_from_json(data.get("decoder"), is_byte_level)
        normalizer = normalizer_from_json(data.get("normalizer"))
    except TokenizerError as e:
        raise TokenizerError(f"{where}: {e}") from None
    unk = model.get("unk_token")
    return Tokenizer(
        _check_vocab(model.get("vocab"), where),
        _parse_merges(model.get("merges", []), where),
        added_tokens=_added_tokens(data, where),
        pre_tokenizer=pre_tokenizer,
        normalizer=normalizer,
        ignore_merges=bool(model.get("ignore_merges", False)),
        whole_words=_whole_words(model, where),
        template=_template_from_json(data.get("post_processor")),
        symbols=Symbols(is_byte_level, bool(model.get("byte_fallback")), unk, bool(model.get("fuse_unk"))),
        decoder=decoder,
    )


def _whole_words(model: dict, where: str) -> str | None:
    """nexttok's own BPE key "whole_words" (no HF file has it; the GGUF reader writes it): a regex, the
    words matching it whole that are tokens skip the merges (see Tokenizer)."""
    pattern = model.get("whole_words")
    if pattern is None:
        return None
    try:
        regex.compile(pattern)
    except (regex.error, TypeError) as e:
        raise TokenizerError(f"{where}: BPE whole_words {pattern!r} is not a regex: {e}") from None
    return pattern


def _added_tokens(data: dict, where: str) -> list[AddedToken]:
    try:
        return [
            AddedToken(t["content"], t["id"], t.get("special", False), t.get("lstrip", False),
                       t.get("rstrip", False), t.get("single_word", False))
            for t in data.get("added_tokens") or []
        ]
    except (KeyError, TypeError, AttributeError) as e:
        raise TokenizerError(f"{where}: malformed added_tokens entry ({e!r})") from None


def from_vocab_merges(vocab_path: str | Path, merges_path: str | Path) -> Tokenizer:
    """Load GPT-2's vocab.json + merges.txt (or encoder.json + vocab.bpe).

    <|endoftext|> becomes a special token when the vocab has it, as in GPT-2.
    """
    vocab_path, merges_path = Path(vocab_path), Path(merges_path)
    vocab = _check_vocab(_read_json(vocab_path, "vocab file"), str(vocab_path))
    try:
        lines = merges_path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise FileNotFoundError(f"merges file not found: {merges_path}") from None
    except UnicodeDecodeError as e:
        raise TokenizerError(f"merges file {merges_path} is not UTF-8 text: {e}") from None
    entries = [ln for ln in lines if ln.strip() and not ln.startswith("#version")]
    merges = _parse_merges(entries, str(merges_path))
    eot = "<|endoftext|>"
    added = [AddedToken(eot, vocab[eot], special=True)] if eot in vocab else []
    return Tokenizer(vocab, merges, added_tokens=added)


_FILE_SETS = (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"))


def from_directory(directory: str | Path) -> Tokenizer:
    """Load from a model directory: tokenizer.json, else vocab.json + merges.txt."""
    directory = Path(directory)
    if (directory / "tokenizer.json").is_file():
        return from_tokenizer_json(directory / "tokenizer.json")
    for vocab_name, merges_name in _FILE_SETS:
        if (directory / vocab_name).is_file() and (directory / merges_name).is_file():
            return from_vocab_merges(directory / vocab_name, directory / merges_name)
    raise FileNotFoundError(
        f"no tokenizer in {directory}: expected tokenizer.json, vocab.json + merges.txt, "
        "or encoder.json + vocab.bpe"
    )
