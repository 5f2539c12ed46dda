"""The metadata and tensor table of a GGUF file, as the third-party `gguf` package parses them.

The package's reader is wrapped so that a cut-short file says it is truncated (and where) instead of
failing inside numpy, and its arrays are read in one pass (the package reads each item through numpy:
~2 s for a 49k-token vocabulary, 7 s for Gemma 3's 262k, 13 s for Gemma 4's with its 515k merges;
in one pass 0.5, 1.5 and 2.5 s). What it parsed is kept as a JSON index in the nexttok cache, and
reading the index takes almost nothing.
Mapping this metadata to HF's config and tokenizer is gguf.py's job.

    meta, entries = read_metadata(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))
    meta["llama.block_count"] == 30; entries[0].name == "token_embd.weight"
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path


class GGUFError(ValueError):
    """A GGUF file that is unreadable or describes something nexttok does not support."""


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes are in the file."""

    name: str  # llama.cpp's name
    kind: str  # GGML type name: "Q4_1", "Q8_0", "F32", ...
    dims: tuple[int, ...]  # HF order: (rows, columns) or (n,)
    offset: int  # from the start of the file
    n_bytes: int


def read_metadata(path: Path, index_dir: Path | None = None) -> tuple[dict, list[TensorEntry]]:
    """The file's metadata fields and tensor table, as the `gguf` package parses them. With
    index_dir, they are kept there as JSON, keyed by the file's content, and the next open reads
    only that. What is kept is the file's own metadata, not our mapping of it: a newer nexttok maps
    it anew."""
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    index = index_dir / f"{path.stem}-{fingerprint(path)}.meta.json" if index_dir is not None else None
    if index is not None and index.is_file():
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
            return data["meta"], [TensorEntry(**{**e, "dims": tuple(e["dims"])}) for e in data["entries"]]
        except (ValueError, KeyError, TypeError):
            pass  # a damaged index: parse the file again and rewrite it
    reader = gguf_reader(path)
    meta = _fields(reader)
    entries = [TensorEntry(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)),
                           int(t.data_offset), int(t.n_bytes)) for t in reader.tensors]
    if index is not None:
        _write_index(index, {"meta": meta, "entries": [dataclasses.asdict(e) for e in entries]})
    return meta, entries


def fingerprint(path: Path) -> str:
    """Short id of a file's content (size + sha256 of its first and last MiB)."""
    digest = hashlib.sha256(str(path.stat().st_size).encode())
    with path.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, path.stat().st_size - (1 << 20)))
        digest.update(f.read())
    return digest.hexdigest()[:12]


def _write_index(index: Path, data: dict) -> None:
    temporary = index.with_suffix(f".{os.getpid()}.tmp")
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        os.replace(temporary, index)  # atomic: a reader never sees half an index
    except OSError:  # a read-only or full cache: the index only saves time, the file still loads
        temporary.unlink(missing_ok=True)


class _Truncated(Exception):
    """The file ends before the bytes its header says it holds."""


def gguf_reader(path: Path):
    """The `gguf` package's GGUFReader over path, its arrays read in one pass and every read checked
    against the end of the file (GGUFError: truncated, or not a GGUF file)."""
    try:
        import gguf  # the third-party package (absolute import), not this module
    except ImportError:
        raise GGUFError("reading GGUF files needs the `gguf` package: pip install gguf") from None
    if path.stat().st_size == 0:
        raise GGUFError(f"{path} is empty (0 bytes): not a GGUF file")
    try:
        return _checked_reader(gguf)(str(path))
    except _Truncated as e:
        raise GGUFError(f"{path} is truncated: {e}") from None
    except Exception as e:  # the reader raises bare ValueError/KeyError/struct errors
        raise GGUFError(f"{path} is not a readable GGUF file: {type(e).__name__}: {e}") from None


@functools.cache
def _checked_reader(gguf):
    """The `gguf` package's GGUFReader, with every read checked against the end of the file first:
    on a cut-short file it would fail with a numpy error ("cannot reshape array of size ..."); and
    reading from a plain view of the mapped file, not the np.memmap itself."""
    import numpy as np

    sizes: dict = {}  # dtype -> bytes per item (called ~1M times for a 262k-token vocabulary)

    class CheckedReader(gguf.GGUFReader):
        def _get(self, offset, dtype, count=1, *args, **kwargs):
            if type(self.data) is np.memmap:  # the same mapped bytes as a plain array: slicing a
                self.data = self.data.view(np.ndarray)  # memmap costs ~10 µs, 4x the parse (262k tokens: 23 s)
            size = sizes.get(dtype) or sizes.setdefault(dtype, np.dtype(dtype).itemsize)
            end = int(offset) + size * int(count)
            if end > len(self.data):
                raise _Truncated(f"the file ends at byte {len(self.data):,}, inside its header "
                                 "(metadata and tensor table)")
            return super()._get(offset, dtype, count, *args, **kwargs)

        def _get_field_parts(self, orig_offs, raw_type, *args, **kwargs):
            if self.byte_order == "I" and sys.byteorder == "little" and raw_type == gguf.GGUFValueType.ARRAY:
                parts = _array_parts(self, gguf, orig_offs)
                if parts is not None:
                    return parts
            return super()._get_field_parts(orig_offs, raw_type, *args, **kwargs)

        def _build_tensors(self, start_offs, fields, *args, **kwargs):
            ends = {}
            for info in fields:
                _, name, _, dims, kind, offset = info.parts
                try:
                    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(kind[0]))]
                except (ValueError, KeyError):
                    continue  # an unknown type: the reader itself names it
                n_bytes = math.prod(int(d) for d in dims) * size // block
                ends[bytes(name).decode(errors="replace")] = int(start_offs) + int(offset[0]) + n_bytes
            last = max(ends, key=ends.__getitem__, default=None)
            if last is not None and ends[last] > len(self.data):
                raise _Truncated(f"tensor {last!r} needs bytes up to {ends[last]:,} but the file has "
                                 f"{len(self.data):,}")
            return super()._build_tensors(start_offs, fields, *args, **kwargs)

    return CheckedReader


def _array_parts(reader, gguf, offset: int):
    """The parts gguf's reader makes of an array of strings or numbers (a length and a bytes part per
    string, a one-item part per number), made without its per-item numpy reads: those took ~10 s of
    the ~13 s that a 262k-token vocabulary with 515k merges took to parse. None for arrays of arrays
    (the reader's own code reads those)."""
    import numpy as np

    kind, count = reader._get(offset, np.uint32), reader._get(offset + 4, np.uint64)
    try:
        item = gguf.GGUFValueType(int(kind[0]))
    except ValueError:
        return None  # the reader's own code names it (or, for an empty array, never looks)
    start, n, data = offset + 12, int(count[0]), reader.data
    parts: list = [kind, count]
    types = [gguf.GGUFValueType.ARRAY] + [item] * (n > 0)  # as the reader's: no item type when empty
    if item == gguf.GGUFValueType.STRING:
        view, lengths, end = memoryview(data), np.dtype("<u8"), len(data)
        for _ in range(n):
            if start + 8 > end:
                reader._get(start, np.uint64)  # raises _Truncated, naming where the file ends
            size = int.from_bytes(view[start:start + 8], "little")
            if start + 8 + size > end:
                reader._get(start + 8, np.uint8, size)
            parts += (data[start:start + 8].view(lengths), data[start + 8:start + 8 + size])
            start += 8 + size
        return start - offset, parts, list(range(3, len(parts), 2)), types
    dtype = reader.gguf_scalar_to_np.get(item)
    if dtype is None:
        return None
    values = reader._get(start, dtype, n)  # checked against the end of the file
    parts += (values[i:i + 1] for i in range(n))
    return 12 + int(values.nbytes), parts, list(range(2, n + 2)), types


def _fields(reader) -> dict:
    """Every metadata field the reader can decode; one it cannot is left out (it may be unused;
    a needed one is then reported missing)."""
    out = {}
    for name, field_ in reader.fields.items():
        try:
            out[name] = field_.contents()
        except Exception:  # e.g. a string that is not UTF-8
            continue
    return out
