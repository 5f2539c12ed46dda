"""Incremental detokenization for streaming.

A byte-level token can end in the middle of a UTF-8 character (an emoji is often 2-4 tokens), so
text is released only once its bytes are complete; the partial bytes wait for the next token.
Concatenating everything released, then `flush()`, equals `Tokenizer.decode(all ids)`.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from nexttok.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Feed token ids one at a time; get back the text each one completes.

    >>> d = IncrementalDetokenizer(gpt2); [d.add(i) for i in gpt2.encode("é")]   # é = 2 tokens
    ['', 'é']
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        # Invalid bytes become U+FFFD exactly as bytes.decode(errors="replace") does, and an
        # incomplete trailing character is held back rather than replaced.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        """Text completed by this token ('' while a character is still partial)."""
        data = self.tokenizer.decode_bytes([token_id], skip_special=self.skip_special)
        return self._decoder.decode(data)

    def add_many(self, ids: Iterable[int]) -> str:
        return "".join(self.add(i) for i in ids)

    @property
    def pending_bytes(self) -> bytes:
        """Bytes of an incomplete character still held back."""
        return self._decoder.getstate()[0]

    def flush(self) -> str:
        """End of stream: whatever is held back, an incomplete character becoming U+FFFD."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
