"""HF transformers reading a GGUF, the oracle of the GGUF tests, in a fraction of its usual time.

transformers parses a GGUF with gguf.GGUFReader: once for the config, once more for the weights, and
once for a tokenizer. For a 262k-token vocabulary a parse slices an np.memmap ~1M times (~20 s), so
loading Gemma 3's model and tokenizer took ~90 s of the suite. `reads_gguf_once` hands transformers a
reader that parses each file once in the session (the same bytes viewed as a plain ndarray, which
slices ~4x faster) and gives that same reader to every later parse of the file. Nothing that
transformers computes from the reader changes: it is gguf's own reader, parsed once.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import numpy as np
import pytest

_PARSED: dict[tuple, object] = {}  # (path, size, mtime) -> the reader: one file at a time


@functools.cache
def _reader_class():
    import gguf

    class PlainArrayReader(gguf.GGUFReader):
        def _get(self, offset, dtype, count=1, *args, **kwargs):
            if type(self.data) is np.memmap:
                self.data = self.data.view(np.ndarray)
            return super()._get(offset, dtype, count, *args, **kwargs)

    return PlainArrayReader


def parsed_once(path, mode="r"):
    """gguf.GGUFReader(path), parsed once while the file is unchanged (one file kept at a time)."""
    stat = Path(path).stat()
    key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, mode)
    if key not in _PARSED:
        _PARSED.clear()
        _PARSED[key] = _reader_class()(path, mode)
    return _PARSED[key]


@contextlib.contextmanager
def reads_gguf_once():
    """Inside: every gguf.GGUFReader(path) that transformers makes is parsed_once(path)."""
    import gguf

    _reader_class()  # made from the real class, before the patch
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", parsed_once)
        yield
