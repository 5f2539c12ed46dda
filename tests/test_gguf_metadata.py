"""The metadata reader: the `gguf` package's GGUFReader with its arrays read in one pass.

The package's reader is the oracle: for every field of a file, the checked reader's parts (each
part's type and bytes), data indices and value types equal the package's own, for arrays of every
value type (strings of many lengths, numbers, empty arrays, arrays of arrays), on a written file and
on the real default model. A file cut anywhere inside its header is reported as truncated there.
"""

from __future__ import annotations

import re
import struct

import gguf
import numpy as np
import pytest

from nexttok.checkpoints.bundled import DEFAULT_MODEL, bundled_model_file
from nexttok.checkpoints.gguf.metadata import GGUFError, gguf_reader, read_metadata

TOKENS = ["", "a", "é", "日本語", "<|end|>", "x" * 300, " \n\t", "\u0120b"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "arrays.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.5 * i - 1 for i in range(len(TOKENS))])
    writer.add_token_types([1, 1, 1, 1, 3, 1, 6, 1])
    writer.add_token_merges(["a b", "é x"])
    sub = gguf.GGUFValueType
    for kind, values in [(sub.UINT8, [0, 255]), (sub.INT8, [-128, 7]), (sub.UINT16, [65535]), (sub.INT16, [-3]),
                         (sub.UINT32, [1, 2, 3]), (sub.INT32, [-1]), (sub.FLOAT32, [1.5, -0.0]),
                         (sub.UINT64, [2**63]), (sub.INT64, [-(2**40)]), (sub.FLOAT64, [1e300]),
                         (sub.BOOL, [True, False, True])]:
        writer.add_key_value(f"test.{kind.name.lower()}", values, sub.ARRAY, sub_type=kind)
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_array("test.nested_strings", [["a", "bc"], ["d"]])
    writer.add_string("test.plain", "é")
    writer.add_uint32("test.scalar", 7)
    writer.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _empty_arrays(path):
    """A header with empty arrays, which the package's writer refuses to write but a file may hold."""
    def key(name: str) -> bytes:
        return struct.pack("<Q", len(name)) + name.encode()

    array = gguf.GGUFValueType.ARRAY
    fields = [key("general.architecture") + struct.pack("<IQ", gguf.GGUFValueType.STRING, 5) + b"llama",
              key("test.empty_strings") + struct.pack("<IIQ", array, gguf.GGUFValueType.STRING, 0),
              key("test.empty_ints") + struct.pack("<IIQ", array, gguf.GGUFValueType.INT32, 0),
              key("test.empty_unknown") + struct.pack("<IIQ", array, 99, 0),  # no such item type: never read
              key("test.after") + struct.pack("<IIQ", array, gguf.GGUFValueType.STRING, 1) + struct.pack("<Q", 1) + b"z"]
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(fields)) + b"".join(fields))
    return path


def _as_read(reader) -> dict:
    return {name: ([(p.dtype.str, p.tobytes()) for p in f.parts], list(f.data), list(f.types), f.offset)
            for name, f in reader.fields.items()}


def _same_as_the_package(path):
    ours, theirs = gguf_reader(path), gguf.GGUFReader(str(path))
    assert _as_read(ours) == _as_read(theirs)
    assert {n: f.contents() for n, f in ours.fields.items()} == {n: f.contents() for n, f in theirs.fields.items()}
    assert [(t.name, t.data_offset, t.n_bytes) for t in ours.tensors] == [
        (t.name, t.data_offset, t.n_bytes) for t in theirs.tensors]
    return ours


def test_every_array_reads_as_the_package_reads_it(written):
    fields = _same_as_the_package(written).fields
    assert fields["tokenizer.ggml.tokens"].contents() == TOKENS
    assert fields["test.nested"].contents() == [1, 2, 3]  # the package flattens arrays of arrays
    assert fields["test.bool"].contents() == [True, False, True]


def test_empty_arrays_read_as_the_package_reads_them(tmp_path):
    fields = _same_as_the_package(_empty_arrays(tmp_path / "empty.gguf")).fields
    names = ("test.empty_strings", "test.empty_ints", "test.empty_unknown", "test.after")
    assert [fields[n].contents() for n in names] == [[], [], [], ["z"]]


def test_the_default_model_reads_as_the_package_reads_it():
    fields = _same_as_the_package(bundled_model_file(DEFAULT_MODEL)).fields
    assert len(fields["tokenizer.ggml.tokens"].contents()) == 49152


def test_a_cut_anywhere_in_the_header_is_truncated_there(written, tmp_path):
    last = gguf.GGUFReader(str(written)).tensors[-1].field  # the tensor table's last entry; then padding
    header_end = last.offset + sum(int(p.nbytes) for p in last.parts)
    data = written.read_bytes()
    cut = tmp_path / "cut.gguf"
    for size in range(1, header_end):
        cut.write_bytes(data[:size])
        message = f"{cut} is truncated: the file ends at byte {size:,}, inside its header (metadata and tensor table)"
        with pytest.raises(GGUFError, match=f"^{re.escape(message)}$"):
            read_metadata(cut)
