"""Incremental detokenization for streaming.

A token can end in the middle of a UTF-8 character (an emoji is often 2-4 byte-level tokens, or
four <0xNN> byte-fallback tokens), so text is released only once its bytes are complete; the
partial bytes wait for the next token.

A stream usually continues a prompt, so by default nothing is stripped: what is released equals
`decode(prompt + ids)` minus `decode(prompt)`. With at_start=True the ids begin a sequence, and the
released text, then `flush()`, equals `Tokenizer.decode(ids)` (a SentencePiece tokenizer's prefix
space stripped, as decode does).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from nexttok.tokenizers.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Feed token ids one at a time; get back the text each one completes.

    >>> d = IncrementalDetokenizer(gpt2); [d.add(i) for i in gpt2.encode("é")]   # é = 2 tokens
    ['', 'é']
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False, at_start: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._first = at_start  # the next id begins the sequence
        self._to_strip = tokenizer.decoder.strip_count if at_start else 0
        # Invalid bytes become U+FFFD exactly as bytes.decode(errors="replace") does, and an
        # incomplete trailing character is held back rather than replaced.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        """Text completed by this token ('' while a character is still partial)."""
        data = self.tokenizer.decode_bytes([token_id], skip_special=self.skip_special, at_start=self._first)
        if data or not (self.skip_special and token_id in self.tokenizer.special_ids):
            self._first = False
        return self._strip(self._decoder.decode(data))

    def add_many(self, ids: Iterable[int]) -> str:
        return "".join(self.add(i) for i in ids)

    @property
    def pending_bytes(self) -> bytes:
        """Bytes of an incomplete character still held back."""
        return self._decoder.getstate()[0]

    def flush(self) -> str:
        """End of stream: whatever is held back, an incomplete character becoming U+FFFD."""
        text = self._strip(self._decoder.decode(b"", final=True))
        self._decoder.reset()
        return text

    def _strip(self, text: str) -> str:
        """Drop the sequence's leading strip characters (Decoder.strip_start) as they arrive."""
        if not self._to_strip or not text:
            return text
        strip, n = self.tokenizer.decoder.strip, 0
        while n < len(text) and n < self._to_strip and text[n] == strip:
            n += 1
        self._to_strip = 0 if n < len(text) else self._to_strip - n
        return text[n:]
