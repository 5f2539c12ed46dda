"""BPE tokenizers as HF `tokenizers` runs them: the algorithm alone.

Byte-level (GPT-2, Llama 3, Qwen2, SmolLM):
    text ─added tokens split out→ segments ─normalize→ ─pre-tokenize (regex)→ words
         ─bytes → printable chars→ ─merge pairs by rank (bpe.py)→ token ids
SentencePiece-style (Llama 2, Mistral, TinyLlama, Gemma, Phi-3):
    text ─added tokens split out→ segments ─normalize (" " → "▁", maybe a leading "▁")→
         ─pre-tokenize (Metaspace, or none: the segment is one word)→ characters, each one not
         in the vocab as its UTF-8 bytes <0xNN> (byte fallback) ─merge by rank→ token ids
Decoding: each id stands for bytes (a Decoder says which: "▁" is a space, <0xE6> one byte), and
the SentencePiece prefix space is stripped at the start of a whole sequence.

Reading HF's files (tokenizer.json, vocab.json + merges.txt) is tokenizer_json's job, GGUF
metadata gguf_tokenizer's; finding them from a model name is sources'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

import regex

from nexttok.tokenizers.bpe import merge
from nexttok.tokenizers.pre_tokenizers import PreTokenizer, byte_level

_CACHE_LIMIT = 200_000  # words; cleared when full so memory stays bounded on endless input
_CACHED_WORD = 64  # longer words (a SentencePiece paragraph) are not worth keeping
# the tokens llama.cpp ends a Gemma 4 turn at beside a file's eos (llama-vocab.cpp, special_eog_ids): the
# GGUF reader makes them control tokens, and a gemma4 model stops at them (models/gemma4_gguf.py)
GEMMA4_END_TOKENS = ("<eos>", "<turn|>", "<|tool_response>")


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
    try:  # one str.translate per token (a vocabulary of 49k: 0.07 s as a comprehension, 0.01 s so)
        return token.translate(_to_latin1()).encode("latin-1")
    except UnicodeEncodeError:
        return token.encode("utf-8")


@lru_cache(maxsize=1)
def _to_latin1() -> dict[int, int]:
    """str.translate's table taking each byte-level character to the code point of its byte, and
    every other character below 256 to one that latin-1 cannot encode (so that a token with any
    character outside the byte-level alphabet is not byte-level text)."""
    table = {ord(c): b for c, b in unicode_to_bytes().items()}
    return {**{c: 0x10000 for c in range(256)}, **table}


@dataclass(frozen=True)
class AddedToken:
    """A token matched in the raw text before BPE and never split (e.g. <|endoftext|>)."""

    content: str
    id: int
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False


def byte_token(b: int) -> str:
    """The vocab entry byte fallback uses for a byte, as HF spells it: byte_token(0xE6) == "<0xE6>"."""
    return f"<0x{b:02X}>"


@dataclass(frozen=True)
class Decoder:
    """How ids become text: the bytes each vocab entry stands for; at the start of a whole sequence
    the first token's own bytes where they differ (HF's Metaspace decoder drops its "▁"s), and up to
    strip_count leading `strip` characters removed (HF's Strip: the space SentencePiece tokenizers
    put before the first word)."""

    token_bytes: Callable[[str], bytes]
    first_token_bytes: Callable[[str], bytes] | None = None
    strip: str = " "
    strip_count: int = 0

    def strip_start(self, text: str) -> str:
        """strip_start(" Hello") == "Hello" with strip_count 1."""
        n = 0
        while n < self.strip_count and text[n : n + 1] == self.strip:
            n += 1
        return text[n:]


BYTE_LEVEL_DECODER = Decoder(_token_bytes)


@dataclass(frozen=True)
class Piece:
    """One token for display: its id, the bytes it stands for, and readable text."""

    id: int
    bytes: bytes
    text: str


@dataclass(frozen=True)
class Symbols:
    """How a word becomes the symbols BPE merges. byte_level: its UTF-8 bytes as GPT-2's printable
    characters; otherwise its characters. A symbol not in the vocab becomes its bytes' <0xNN>
    tokens (byte_fallback), else the unknown token (runs of them fused into one with fuse_unk),
    else it is dropped, as HF does."""

    byte_level: bool = True
    byte_fallback: bool = False
    unk_token: str | None = None
    fuse_unk: bool = False


class Tokenizer:
    """A BPE tokenizer, byte-level or SentencePiece-style.

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
        whole_words: str | None = None,
        template: tuple[list[int], list[int]] = ([], []),
        symbols: Symbols | None = None,
        decoder: Decoder | None = None,
    ):
        self.vocab = dict(vocab)
        # the pairs hold the vocabulary's own strings, not copies: 17 MB less for a 151k-merge vocabulary
        own = {token: token for token in self.vocab}
        self.merge_ranks = {(own.get(a, a), own.get(b, b)): rank for rank, (a, b) in enumerate(merges)}
        del own
        self.added_tokens = sorted(added_tokens, key=lambda t: t.id)
        self.symbols = symbols or Symbols()
        if self.symbols.unk_token is not None and self.symbols.unk_token not in self.vocab:
            # HF fails only when a character needs it; files naming an absent unk_token exist
            self.symbols = dataclasses.replace(self.symbols, unk_token=None)
        self.pre_tokenizer = pre_tokenizer or (byte_level() if self.symbols.byte_level else None)
        self.normalizer = normalizer
        self.ignore_merges = ignore_merges
        # a word matching this whole that is a token is that token, unmerged: HF's ignore_merges for some
        # words only (llama.cpp's gemma4 so keeps a run of newlines, "\n+", whole: its PR 21343)
        self._whole_word = regex.compile(whole_words).fullmatch if whole_words else None
        self.template = template
        self.decoder = decoder or BYTE_LEVEL_DECODER
        self._check_merges()
        self._id_bytes = self._build_id_bytes()
        self._special_ids = frozenset(t.id for t in self.added_tokens if t.special)
        self._added_re = {allow: self._added_pattern(allow) for allow in (True, False)}
        self._added_by_content = {t.content: t for t in self.added_tokens}
        self._cache: dict[str, list[int]] = {}
        self._id_tokens: dict[int, str] | None = None

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
            table[i] = self.decoder.token_bytes(token)
        for t in self.added_tokens:  # byte-level: their text as is; SentencePiece: "▁" is a space
            table[t.id] = t.content.encode() if self.symbols.byte_level else self.decoder.token_bytes(t.content)
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
            self._encode_ordinary(text, ids, True)
        else:
            pattern, group_ids = added
            pos = 0
            for m in pattern.finditer(text):
                if m.start() > pos:
                    self._encode_ordinary(text[pos : m.start()], ids, pos == 0)
                ids.append(group_ids[m.lastindex])
                pos = m.end()
            if pos < len(text):
                self._encode_ordinary(text[pos:], ids, pos == 0)
        if add_special:
            prefix, suffix = self.template
            ids = [*prefix, *ids, *suffix]
        return ids

    def decode_bytes(self, ids: Iterable[int], *, skip_special: bool = False, at_start: bool = False) -> bytes:
        """Ids to the raw bytes they stand for (may end inside a UTF-8 character). at_start: the
        first id begins a sequence (see Decoder.first_token_bytes); the prefix space stays."""
        table = self._id_bytes
        out = []
        for i in ids:
            if type(i) is not int and not isinstance(i, int):
                raise TypeError(f"token id must be int, got {type(i).__name__}")
            if i < 0 or i >= len(table) or table[i] is None:
                raise ValueError(f"token id {i} is not in the vocabulary (valid: 0..{len(table) - 1})")
            if skip_special and i in self._special_ids:
                continue
            if at_start and self.decoder.first_token_bytes is not None:
                out.append(self.decoder.first_token_bytes(self._token_string(i)))
            else:
                out.append(table[i])
            at_start = False
        return b"".join(out)

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Ids to text, as a whole sequence (a SentencePiece prefix space stripped); invalid UTF-8
        (a cut-off character) becomes U+FFFD, as in HF."""
        data = self.decode_bytes(ids, skip_special=skip_special, at_start=True)
        return self.decoder.strip_start(data.decode("utf-8", errors="replace"))

    def _token_string(self, token_id: int) -> str:
        """The vocab entry (or added token) of an id, as the file spells it."""
        if self._id_tokens is None:
            self._id_tokens = {i: t for t, i in self.vocab.items()}
            self._id_tokens.update((t.id, t.content) for t in self.added_tokens)
        return self._id_tokens[token_id]

    def pieces(self, ids: Iterable[int]) -> list[Piece]:
        """Each token's own text, for display: a byte that is part of a character shows as \\xNN.

        pieces(encode(" unbelievable")) -> [Piece(17496, b' unbel', ' unbel'), Piece(11203, b'iev', ...)]
        """
        return [Piece(i, b, b.decode("utf-8", errors="backslashreplace"))
                for i in ids for b in [self.decode_bytes([i])]]

    # -- the BPE core --------------------------------------------------------------------------

    def _encode_ordinary(self, text: str, ids: list[int], at_start: bool) -> None:
        """Append the ids of text that holds no added token; at_start: it begins the input."""
        if self.normalizer is not None:
            text = self.normalizer(text)
            if not text:
                return
        words = self.pre_tokenizer([text], at_start) if self.pre_tokenizer else [text]
        cache = self._cache
        for word in words:
            cached = cache.get(word)
            if cached is None:
                cached = self._bpe(_byte_level(word) if self.symbols.byte_level else word)
                if len(word) <= _CACHED_WORD:
                    if len(cache) >= _CACHE_LIMIT:  # bounded memory on endless distinct words
                        cache.clear()
                    cache[word] = cached
            ids += cached

    def _bpe(self, word: str) -> list[int]:
        """The ids of one word (in byte-level characters, or plain for SentencePiece-style).

        With GPT-2's merges: _bpe("Ġhello") -> [23748]
        """
        vocab = self.vocab
        if (self.ignore_merges or (self._whole_word is not None and self._whole_word(word))) and word in vocab:
            return [vocab[word]]
        return [vocab[p] for p in merge(self._symbols(word), self.merge_ranks)]

    def _symbols(self, word: str) -> list[str]:
        """The symbols BPE starts from (see Symbols): "a日" -> ["a", "<0xE6>", "<0x97>", "<0xA5>"]
        when 日 is not in the vocab and byte fallback is on."""
        vocab = self.vocab
        chars = list(word)
        if all(c in vocab for c in chars):
            return chars
        out: list[str] = []
        unk, fuse, fallback = self.symbols.unk_token, self.symbols.fuse_unk, self.symbols.byte_fallback
        pending = False  # an unk token not yet added: HF adds it lazily, so a run can be fused
        for c in chars:
            if c in vocab:
                if pending:
                    out.append(unk)
                    pending = False
                out.append(c)
                continue
            tokens = [byte_token(b) for b in c.encode()] if fallback else None
            if tokens and all(t in vocab for t in tokens):
                out += tokens  # (a pending unk stays pending across them, as in HF)
            elif unk is not None:
                if pending and not fuse:
                    out.append(unk)
                pending = True
        if pending:
            out.append(unk)
        return out


def _reject_surrogates(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"text contains a lone surrogate {text[e.start]!r} at index {e.start}; "
            "it is not valid Unicode and cannot be encoded as UTF-8"
        ) from None
