"""Byte-level BPE, as used by GPT-2, Llama 3, Qwen2 and SmolLM.

text ─added tokens split out→ segments ─normalize→ ─pre-tokenize (regex)→ words
     ─bytes → printable chars→ ─merge pairs by rank→ token ids

Loads HF `tokenizer.json`, or GPT-2's `vocab.json` + `merges.txt` (a.k.a. `encoder.json` +
`vocab.bpe`). Everything below is plain Python over the `regex` engine.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import regex

# GPT-2's pre-tokenizer pattern; also what a ByteLevel pre-tokenizer with use_regex uses.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Llama 3's and Qwen2's Split patterns (as their tokenizer.json files write them)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_CACHE_LIMIT = 200_000  # words; cleared when full so memory stays bounded on endless input


class TokenizerError(ValueError):
    """A tokenizer file that is malformed or uses a feature nexttok does not implement."""


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character.

    bytes_to_unicode()[ord("A")] == "A"; bytes_to_unicode()[ord(" ")] == "Ġ"
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table, shift = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """Inverse of bytes_to_unicode: unicode_to_bytes()["Ġ"] == 32."""
    return {c: b for b, c in bytes_to_unicode().items()}


def _byte_level(text: str) -> str:
    """Map UTF-8 bytes to GPT-2's printable chars: _byte_level("é ") == "Ã©Ġ"."""
    table = bytes_to_unicode()
    return "".join([table[b] for b in text.encode("utf-8")])


def _token_bytes(token: str) -> bytes:
    """Bytes a vocab entry stands for: _token_bytes("ĠParis") == b" Paris".

    Entries that are not byte-level text (e.g. "<|endoftext|>" only partly is) fall back to UTF-8.
    """
    inverse = unicode_to_bytes()
    try:
        return bytes([inverse[c] for c in token])
    except KeyError:
        return token.encode("utf-8")


@dataclass(frozen=True)
class AddedToken:
    """A token matched in the raw text before BPE and never split (e.g. <|endoftext|>)."""

    content: str
    id: int
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False


@dataclass(frozen=True)
class Piece:
    """One token for display: its id, the bytes it stands for, and readable text."""

    id: int
    bytes: bytes
    text: str


# ---------------------------------------------------------------------------------------------
# Pre-tokenizers: each turns a list of strings into a finer list of strings (HF semantics).

PreTokenizer = Callable[[list[str]], list[str]]


def _split_isolated(pattern: regex.Pattern, text: str) -> list[str]:
    """Matches and the gaps between them, in order: ("a1", \\d) -> ["a", "1"]."""
    words = pattern.findall(text)
    if sum(map(len, words)) == len(text):  # the usual case: the pattern covers all text
        return words
    out, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            out.append(text[pos : m.start()])
        if m.end() > m.start():
            out.append(m.group())
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


def _split_spans(pattern: regex.Pattern, text: str, invert: bool) -> list[tuple[str, bool]]:
    """(piece, is_match) over the whole text; invert swaps which side counts as the match."""
    spans, pos = [], 0
    for m in pattern.finditer(text):
        if m.end() == m.start():
            continue
        if m.start() > pos:
            spans.append((text[pos : m.start()], invert))
        spans.append((m.group(), not invert))
        pos = m.end()
    if pos < len(text):
        spans.append((text[pos:], invert))
    return spans


def _apply_behavior(spans: list[tuple[str, bool]], behavior: str) -> list[str]:
    """HF SplitDelimiterBehavior over (piece, is_delimiter) spans.

    (["a", ",", ",", "b"], MergedWithPrevious) -> ["a,", ",", "b"]: a delimiter joins its
    neighbour only when that neighbour is not itself a delimiter, as in HF.
    """
    if behavior == "Isolated":
        return [s for s, _ in spans]
    if behavior == "Removed":
        return [s for s, delim in spans if not delim]
    if behavior == "MergedWithNext":  # the mirror image of MergedWithPrevious
        return [s[::-1] for s in _apply_behavior([(s[::-1], d) for s, d in reversed(spans)],
                                                 "MergedWithPrevious")][::-1]
    if behavior not in ("MergedWithPrevious", "Contiguous"):
        raise TokenizerError(f"Split behavior {behavior!r} is not supported")
    out: list[str] = []
    prev_delim = False
    for s, delim in spans:
        joins = (delim and not prev_delim) if behavior == "MergedWithPrevious" else delim == prev_delim
        if joins and out:
            out[-1] += s
        else:
            out.append(s)
        prev_delim = delim
    return out


def _regex_split(pattern: str, behavior: str = "Isolated", invert: bool = False) -> PreTokenizer:
    compiled = regex.compile(pattern)
    if behavior == "Isolated" and not invert:
        def split(words: list[str]) -> list[str]:
            if len(words) == 1:
                return _split_isolated(compiled, words[0])
            return [w for word in words for w in _split_isolated(compiled, word)]
        return split

    def split_general(words: list[str]) -> list[str]:
        out = []
        for word in words:
            out += _apply_behavior(_split_spans(compiled, word, invert), behavior)
        return out
    return split_general


def _byte_level_pre(add_prefix_space: bool, use_regex: bool) -> PreTokenizer:
    splitter = _regex_split(GPT2_PATTERN) if use_regex else None

    def pre(words: list[str]) -> list[str]:
        if add_prefix_space:
            words = [w if w.startswith(" ") else " " + w for w in words]
        return splitter(words) if splitter else words
    return pre


def _digits_pre(individual: bool) -> PreTokenizer:
    return _regex_split(r"\p{N}" if individual else r"\p{N}+")


def _chain(stages: Sequence[PreTokenizer]) -> PreTokenizer:
    if len(stages) == 1:
        return stages[0]

    def chained(words: list[str]) -> list[str]:
        for stage in stages:
            words = stage(words)
        return words
    return chained


_BEHAVIORS = ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous")


def _pretokenizer_from_json(spec: dict | None) -> tuple[PreTokenizer, bool]:
    """Build the pre-tokenizer; the bool says whether a ByteLevel stage was present."""
    if spec is None:
        raise TokenizerError("pre_tokenizer is null: only byte-level BPE tokenizers are supported")
    kind = spec.get("type")
    if kind == "Sequence":
        built = [_pretokenizer_from_json(s) for s in spec.get("pretokenizers", [])]
        if not built:
            raise TokenizerError("pre_tokenizer Sequence is empty")
        return _chain([b[0] for b in built]), any(b[1] for b in built)
    if kind == "ByteLevel":
        return _byte_level_pre(spec.get("add_prefix_space", False), spec.get("use_regex", True)), True
    if kind == "Split":
        pattern = spec.get("pattern", {})
        if "Regex" in pattern:
            source = pattern["Regex"]
        elif "String" in pattern:
            source = regex.escape(pattern["String"])
        else:
            raise TokenizerError(f"Split pre_tokenizer has no pattern: {spec!r}")
        behavior = spec.get("behavior", "Isolated")
        if behavior not in _BEHAVIORS:
            raise TokenizerError(f"Split behavior {behavior!r} is not one of {', '.join(_BEHAVIORS)}")
        try:
            return _regex_split(source, behavior, spec.get("invert", False)), False
        except regex.error as e:
            raise TokenizerError(f"Split pre_tokenizer pattern {source!r} does not compile: {e}") from e
    if kind == "Digits":
        return _digits_pre(spec.get("individual_digits", False)), False
    raise TokenizerError(
        f"pre_tokenizer type {kind!r} is not supported (byte-level BPE uses ByteLevel, Split, Digits)"
    )


def _normalizer_from_json(spec: dict | None) -> Callable[[str], str] | None:
    if spec is None:
        return None
    kind = spec.get("type")
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return lambda text: unicodedata.normalize(kind, text)
    if kind == "Lowercase":  # char by char, as HF: no context rule such as Greek final sigma
        return lambda text: "".join(map(str.lower, text))
    if kind == "Sequence":
        parts = [n for n in map(_normalizer_from_json, spec.get("normalizers", [])) if n]

        def normalize(text: str) -> str:
            for part in parts:
                text = part(text)
            return text
        return normalize
    raise TokenizerError(f"normalizer type {kind!r} is not supported (NFC/NFD/NFKC/NFKD/Lowercase)")


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


# ---------------------------------------------------------------------------------------------


class Tokenizer:
    """Byte-level BPE tokenizer.

    >>> tok.encode("The capital of France is Paris.")   # GPT-2 vocab
    [464, 3139, 286, 4881, 318, 6342, 13]
    """

    def __init__(
        self,
        vocab: dict[str, int],
        merges: Iterable[tuple[str, str]],
        *,
        added_tokens: Iterable[AddedToken] = (),
        pre_tokenizer: PreTokenizer | None = None,
        normalizer: Callable[[str], str] | None = None,
        ignore_merges: bool = False,
        template: tuple[list[int], list[int]] = ([], []),
        unk_token: str | None = None,
    ):
        self.vocab = dict(vocab)
        self.merge_ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.added_tokens = sorted(added_tokens, key=lambda t: t.id)
        self.pre_tokenizer = pre_tokenizer or _byte_level_pre(False, True)
        self.normalizer = normalizer
        self.ignore_merges = ignore_merges
        self.template = template
        self.unk_id = self.vocab.get(unk_token) if unk_token else None
        self._check_merges()
        self._id_bytes = self._build_id_bytes()
        self._special_ids = frozenset(t.id for t in self.added_tokens if t.special)
        self._added_re = {allow: self._added_pattern(allow) for allow in (True, False)}
        self._added_by_content = {t.content: t for t in self.added_tokens}
        self._cache: dict[str, list[int]] = {}

    # -- construction helpers ------------------------------------------------------------------

    def _check_merges(self) -> None:
        for (a, b), rank in self.merge_ranks.items():
            if a + b not in self.vocab:
                raise TokenizerError(
                    f"merge #{rank} {a!r} + {b!r} makes {a + b!r}, which is not in the vocab"
                )

    def _build_id_bytes(self) -> list[bytes | None]:
        size = max([*self.vocab.values(), *(t.id for t in self.added_tokens), -1]) + 1
        table: list[bytes | None] = [None] * size
        for token, i in self.vocab.items():
            if i < 0:
                raise TokenizerError(f"vocab entry {token!r} has negative id {i}")
            table[i] = _token_bytes(token)
        for t in self.added_tokens:
            table[t.id] = t.content.encode("utf-8")
        return table

    def _added_pattern(self, allow_special: bool) -> tuple[regex.Pattern, list[int]] | None:
        """Alternation of the added tokens to match (longest first) and the id of each group."""
        chosen = [t for t in self.added_tokens if allow_special or not t.special]
        if not chosen:
            return None
        alternatives, group_ids = [], [-1]
        for t in sorted(chosen, key=lambda t: len(t.content), reverse=True):  # longest wins
            body = regex.escape(t.content)
            if t.single_word:
                body = rf"(?<![\w]){body}(?![\w])"
            # one capture group per token, so m.lastindex says which token matched
            alternatives.append((r"\s*" if t.lstrip else "") + f"({body})" + (r"\s*" if t.rstrip else ""))
            group_ids.append(t.id)
        return regex.compile("|".join(alternatives)), group_ids

    # -- public API ----------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the size of an embedding table)."""
        return len(self._id_bytes)

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    def token_to_id(self, token: str) -> int | None:
        added = self._added_by_content.get(token)
        return added.id if added else self.vocab.get(token)

    def encode(self, text: str, *, allow_special: bool = True, add_special: bool = False) -> list[int]:
        """Text to ids. allow_special: match special tokens written in the text (as HF does);
        False treats them as plain text. add_special: wrap with the post-processor's BOS/EOS."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        _reject_surrogates(text)
        ids: list[int] = []
        added = self._added_re[allow_special]
        if added is None:
            self._encode_ordinary(text, ids)
        else:
            pattern, group_ids = added
            pos = 0
            for m in pattern.finditer(text):
                if m.start() > pos:
                    self._encode_ordinary(text[pos : m.start()], ids)
                ids.append(group_ids[m.lastindex])
                pos = m.end()
            if pos < len(text):
                self._encode_ordinary(text[pos:], ids)
        if add_special:
            prefix, suffix = self.template
            ids = [*prefix, *ids, *suffix]
        return ids

    def decode_bytes(self, ids: Iterable[int], *, skip_special: bool = False) -> bytes:
        """Ids to the raw bytes they stand for (may end inside a UTF-8 character)."""
        table = self._id_bytes
        out = []
        for i in ids:
            if type(i) is not int and not isinstance(i, int):
                raise TypeError(f"token id must be int, got {type(i).__name__}")
            if i < 0 or i >= len(table) or table[i] is None:
                raise ValueError(f"token id {i} is not in the vocabulary (valid: 0..{len(table) - 1})")
            if skip_special and i in self._special_ids:
                continue
            out.append(table[i])
        return b"".join(out)

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Ids to text; invalid UTF-8 (a cut-off character) becomes U+FFFD, as in HF."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    def pieces(self, ids: Iterable[int]) -> list[Piece]:
        """Each token's own text, for display: a byte that is part of a character shows as \\xNN.

        pieces(encode(" unbelievable")) -> [Piece(17496, b' unbel', ' unbel'), Piece(11203, b'iev', ...)]
        """
        return [Piece(i, b, b.decode("utf-8", errors="backslashreplace"))
                for i in ids for b in [self.decode_bytes([i])]]

    # -- the BPE core --------------------------------------------------------------------------

    def _encode_ordinary(self, text: str, ids: list[int]) -> None:
        """Append the ids of text that holds no added token."""
        if self.normalizer is not None:
            text = self.normalizer(text)
        cache = self._cache
        for word in self.pre_tokenizer([text]):
            cached = cache.get(word)
            if cached is None:
                if len(cache) >= _CACHE_LIMIT:  # bounded memory on endless distinct words
                    cache.clear()
                cached = cache[word] = self._bpe(_byte_level(word))
            ids += cached

    def _bpe(self, word: str) -> list[int]:
        """Merge the byte-level characters of one word by rank, lowest rank first.

        With GPT-2's merges: _bpe("Ġhello") -> [23748]
        """
        vocab = self.vocab
        if self.ignore_merges and word in vocab:
            return [vocab[word]]
        parts = list(word)
        ranks = self.merge_ranks
        while len(parts) > 1:
            best_rank, best = None, -1
            for i in range(len(parts) - 1):
                rank = ranks.get((parts[i], parts[i + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best = rank, i
            if best_rank is None:
                break
            parts = _merge_pair(parts, parts[best], parts[best + 1], best)
        return [self._piece_id(p) for p in parts]

    def _piece_id(self, piece: str) -> int:
        i = self.vocab.get(piece)
        if i is not None:
            return i
        if self.unk_id is not None:
            return self.unk_id
        raise TokenizerError(f"piece {piece!r} is not in the vocab and the tokenizer has no unk_token")


def _merge_pair(parts: list[str], a: str, b: str, start: int) -> list[str]:
    """Merge each non-overlapping (a, b), left to right from start.

    _merge_pair(["a", "a", "a"], "a", "a", 0) -> ["aa", "a"]
    """
    out = parts[:start]
    i, n = start, len(parts)
    while i < n:
        if i + 1 < n and parts[i] == a and parts[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(parts[i])
            i += 1
    return out


def _reject_surrogates(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"text contains a lone surrogate {text[e.start]!r} at index {e.start}; "
            "it is not valid Unicode and cannot be encoded as UTF-8"
        ) from None


# ---------------------------------------------------------------------------------------------
# Loading


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
        pair = entry.split(" ") if isinstance(entry, str) else entry
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) and p for p in pair)):
            raise TokenizerError(f"{where}: merge #{n} {entry!r} is not a pair of two tokens")
        merges.append((pair[0], pair[1]))
    return merges


def _check_bpe_model(model, where: str) -> None:
    if not isinstance(model, dict):
        raise TokenizerError(f"{where}: no 'model' object")
    if model.get("type", "BPE") != "BPE":
        raise TokenizerError(f"{where}: model type {model.get('type')!r} is not supported (only BPE)")
    if model.get("byte_fallback"):
        raise TokenizerError(
            f"{where}: byte_fallback BPE (SentencePiece style, e.g. Llama 2) is not supported"
        )
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise TokenizerError(f"{where}: BPE {key}={model[key]!r} is not supported")
    if model.get("dropout"):
        raise TokenizerError(f"{where}: BPE dropout={model['dropout']!r} is not supported at inference")


def from_tokenizer_json(path: str | Path) -> Tokenizer:
    """Load an HF tokenizer.json (byte-level BPE)."""
    path = Path(path)
    data = _read_json(path, "tokenizer.json")
    where = str(path)
    if not isinstance(data, dict):
        raise TokenizerError(f"{where}: expected a JSON object at the top level")
    model = data.get("model")
    _check_bpe_model(model, where)
    pre_tokenizer, byte_level = _pretokenizer_from_json(data.get("pre_tokenizer"))
    decoder = data.get("decoder")
    if not byte_level or (decoder is not None and decoder.get("type") != "ByteLevel"):
        raise TokenizerError(
            f"{where}: not a byte-level BPE tokenizer (needs a ByteLevel pre-tokenizer and decoder)"
        )
    try:
        added = [
            AddedToken(t["content"], t["id"], t.get("special", False), t.get("lstrip", False),
                       t.get("rstrip", False), t.get("single_word", False))
            for t in data.get("added_tokens") or []
        ]
    except (KeyError, TypeError) as e:
        raise TokenizerError(f"{where}: malformed added_tokens entry ({e!r})") from None
    return Tokenizer(
        _check_vocab(model.get("vocab"), where),
        _parse_merges(model.get("merges", []), where),
        added_tokens=added,
        pre_tokenizer=pre_tokenizer,
        normalizer=_normalizer_from_json(data.get("normalizer")),
        ignore_merges=bool(model.get("ignore_merges", False)),
        template=_template_from_json(data.get("post_processor")),
        unk_token=model.get("unk_token"),
    )


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


def load_tokenizer(source: str | Path) -> Tokenizer:
    """A tokenizer from a file, a model directory, a bundled name (`gpt2`, the default model's
    name or `default`), or a hub id."""
    from nexttok import bundled

    path, name = Path(source), str(source)
    if path.is_file() and path.suffix != ".gguf":
        return from_tokenizer_json(path)
    if name in bundled.BUNDLED_TOKENIZERS and not path.exists():
        directory = bundled.tokenizer_dir(name)
        if directory is not None and directory.is_dir():
            return from_directory(directory)
    directory = bundled.local_checkpoint(source)
    if directory is not None:
        return from_directory(directory)
    from nexttok.weights import TOKENIZER_FILES, hub_snapshot

    return from_directory(hub_snapshot(name, TOKENIZER_FILES))
