"""Byte-level BPE, as used by GPT-2, Llama 3, Qwen2 and SmolLM: the algorithm alone.

text ─added tokens split out→ segments ─normalize→ ─pre-tokenize (regex)→ words
     ─bytes → printable chars→ ─merge pairs by rank→ token ids

Reading HF's files (tokenizer.json, vocab.json + merges.txt) is tokenizer_json's job; finding
them from a model name is sources'. Everything below is plain Python over the `regex` engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

import regex

from nexttok.pretokenizers import PreTokenizer, byte_level

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
        self.pre_tokenizer = pre_tokenizer or byte_level()
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
