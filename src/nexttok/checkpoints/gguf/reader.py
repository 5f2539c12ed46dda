"""Reading a GGUF file (llama.cpp's format): its config, its tokenizer and its tensors, in HF's terms.

A GGUF holds the weights, often quantized, and the tokenizer as metadata. Parsing the file and
dequantizing blocks is the third-party `gguf` package's job (imported when a file is opened;
gguf_metadata.py checks the file is whole and caches what was parsed); the mapping is ours:

- config: llama.cpp metadata keys → HF config.json keys, by the family's registry entry
  (models/registry.py: GGUFLayout.config), where llama.cpp's hard-coded constants are too
- tokenizer: tokens/merges or scores/token types → tokenizer.json (+ its config): gguf_tokenizer.py
- tensors: llama.cpp names → ours by the entry's table; llama.cpp stores Llama's Q and K rows
  interleaved for its RoPE kernel (convert_hf_to_gguf permutes them), so they are permuted back;
  it stores Gemma's RMSNorm weights as 1 + w (its kernel multiplies by the weight), so 1 is taken
  off again

    gguf = read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    gguf.config["num_hidden_layers"] == 30; dict(gguf.tensors())["model.norm.weight"].shape == (576,)
"""

from __future__ import annotations

import dataclasses
import mmap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nexttok.checkpoints.gguf.metadata import GGUFError, TensorEntry, read_metadata
from nexttok.checkpoints.gguf.tokenizer import LLAMA3_PATTERN as LLAMA3_PATTERN  # re-exported for tests
from nexttok.checkpoints.gguf.tokenizer import QWEN2_PATTERN as QWEN2_PATTERN
from nexttok.checkpoints.gguf.tokenizer import hf_tokenizer, vocabulary
from nexttok.models.architecture import GGUFLayout, GGUFMeta
from nexttok.models.config import ConfigError
from nexttok.models.registry import architecture, gguf_architecture

if TYPE_CHECKING:
    import numpy as np


@dataclass
class GGUFFile:
    """An opened GGUF, its config and tokenizer already mapped (so an unsupported file fails here,
    before any tensor is read); blocks() and tensors() read the weights one at a time."""

    path: Path
    config: dict  # HF config.json
    tokenizer: dict = field(repr=False)  # HF tokenizer.json
    tokenizer_config: dict = field(repr=False)  # HF tokenizer_config.json (special tokens, chat template)
    entries: list[TensorEntry] = field(repr=False)

    @property
    def generation_config(self) -> dict:
        """HF generation_config.json: the BOS and EOS ids."""
        return {"bos_token_id": self.config["bos_token_id"], "eos_token_id": self.config["eos_token_id"]}

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(HF name, float32 array) for every tensor, dequantized and un-permuted."""
        return ((tensor.name, tensor.dequantize()) for tensor in self.blocks())

    def blocks(self) -> Iterator[GGUFTensor]:
        """Every tensor as stored (quantized blocks kept, the file mapped, not read), under its HF
        name; llama's Q/K rows (whole rows of blocks) un-permuted, Gemma's norms less 1."""
        import numpy as np

        with open(self.path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        data = np.frombuffer(mapping, dtype=np.uint8)
        layout = architecture(self.config["model_type"]).gguf
        heads = self.config.get("num_attention_heads"), self.config.get("num_key_value_heads")
        layers = self.config.get("num_hidden_layers", self.config.get("n_layer"))
        for entry in self.entries:
            if _block(entry.name) >= layers:  # blocks past the model's (GLM's next-token prediction): unread
                continue
            if entry.name in layout.derived:  # the config has read it (gemma4's rope_freqs): no weight
                continue
            name, kind, raw = _our_name(entry.name, layout), entry.kind, _raw(data, entry)
            place = (mapping, entry.offset)
            if name.endswith(layout.permuted):  # q's rows (weight or bias) by its heads, k's by its own
                raw, place = _unpermute(raw, heads[".q_proj." not in name]), None
            elif layout.norm_offset and name.endswith("norm.weight"):
                (kind, raw), place = ("F32", _less(raw, entry, layout.norm_offset)), None
            elif (values := next((fn for s, (fn, _) in layout.values.items() if name.endswith(s)), None)):
                (kind, raw), place = ("F32", values(_floats(raw, entry))), None
            yield GGUFTensor(name, kind, entry.dims, raw, place)


@dataclass
class GGUFTensor:
    """One tensor as the file stores it. raw: (rows, bytes per row) for block formats (a block never
    spans rows), or the values themselves for F32/F16; shape is HF's (rows, columns) or (n,)."""

    name: str
    kind: str  # GGML type name: "Q4_1", "Q8_0", "F32", ...
    shape: tuple[int, ...]
    raw: np.ndarray = field(repr=False)
    place: tuple[mmap.mmap, int] | None = field(default=None, repr=False)  # (the mapped file, raw's offset)

    def release(self, first: int = 0, stop: int | None = None) -> None:
        """Give back the mapped file's pages of rows first..stop-1 (a loader that has copied them):
        they leave this process's memory (the OS keeps them cached) and are read again if touched.
        Nothing for a tensor that is not a view of the file."""
        if self.place is None:
            return
        mapping, offset = self.place
        row = self.raw.nbytes // max(1, self.raw.shape[0])
        stop = self.raw.shape[0] if stop is None else stop
        start, end = offset + first * row, offset + stop * row
        start -= start % mmap.PAGESIZE  # whole pages; one shared with a neighbour is just read again
        if end > start:
            mapping.madvise(mmap.MADV_DONTNEED, start, end - start)

    def dequantize(self) -> np.ndarray:
        """The values as float32, in HF's shape. F32/F16 (norms, biases) are their values already:
        the `gguf` package (~0.3-0.9 s to import, with yaml) is imported only for a block type."""
        import numpy as np

        if self.kind in ("F32", "F16"):  # what gguf.quants.dequantize does for them
            array = self.raw.view(np.float32 if self.kind == "F32" else np.float16)
            return np.ascontiguousarray(array.reshape(self.shape), dtype=np.float32)
        from gguf import GGMLQuantizationType, quants

        try:
            array = quants.dequantize(self.raw, GGMLQuantizationType[self.kind])
        except Exception as e:
            raise GGUFError(f"cannot dequantize GGUF tensor {self.name!r} ({self.kind}): {e}") from None
        return np.ascontiguousarray(array.reshape(self.shape), dtype=np.float32)


def _less(raw: np.ndarray, entry: TensorEntry, offset: float) -> np.ndarray:
    """A norm weight as HF stores it: llama.cpp's convert_hf_to_gguf added `offset` to it (Gemma's 1)."""
    return _floats(raw, entry) - offset  # float32 whatever it was stored as: 1 + w in float16 lost bits already


def _floats(raw: np.ndarray, entry: TensorEntry) -> np.ndarray:
    """An F32/F16 tensor's values as float32 (GGUFError for another type: a norm or a rate kept as is)."""
    if entry.kind not in ("F32", "F16"):
        raise GGUFError(f"GGUF tensor {entry.name!r} is {entry.kind}; expected F32 or F16")
    return raw.astype("float32")


def _raw(data: np.ndarray, entry: TensorEntry) -> np.ndarray:
    """A tensor's bytes as the `gguf` package's reader gives them: F32/F16 values in their shape,
    other types (rows, bytes per row)."""
    import numpy as np

    chunk = data[entry.offset : entry.offset + entry.n_bytes]
    if entry.kind in ("F32", "F16"):
        return chunk.view(np.float32 if entry.kind == "F32" else np.float16).reshape(entry.dims)
    rows = int(np.prod(entry.dims[:-1])) if len(entry.dims) > 1 else 1
    return chunk.reshape(rows, -1)


def read_gguf(path: str | Path, index_dir: Path | None = None) -> GGUFFile:
    """Open a GGUF file and map its metadata to HF's config and tokenizer (index_dir: see
    read_metadata)."""
    path = Path(path)
    meta, entries = read_metadata(path, index_dir)
    if not entries:  # llama.cpp ships tokenizer-only files (ggml-vocab-*.gguf) for its tests
        kind = " (a vocabulary-only file)" if "tokenizer.ggml.tokens" in meta else ""
        raise GGUFError(f"{path} holds no weights{kind}")
    config = hf_config(meta, {e.name for e in entries}, derived_values(path, meta, entries))
    tokenizer, tokenizer_config = hf_tokenizer(meta)
    return GGUFFile(path, config, tokenizer, tokenizer_config, entries)


def read_gguf_tokenizer(path: str | Path, index_dir: Path | None = None) -> tuple[dict, dict]:
    """(tokenizer.json, tokenizer_config.json) of a GGUF file, whatever its architecture and
    whether or not it holds weights: only the tokenizer metadata is mapped."""
    return hf_tokenizer(read_metadata(Path(path), index_dir)[0])


def derived_values(path: Path, meta: dict, entries: list[TensorEntry]) -> dict[str, tuple[float, ...]]:
    """The values of the file's tensors its layout derives from the config (GGUFLayout.derived:
    gemma4's rope_freqs), which the config is read from; {} for an architecture we do not know
    (hf_config names it)."""
    import numpy as np

    try:
        derived = gguf_architecture(meta.get("general.architecture")).gguf.derived
    except ConfigError:
        return {}
    out = {}
    with open(path, "rb") as f:
        for entry in (e for e in entries if e.name in derived):
            f.seek(entry.offset)
            raw = _raw(np.frombuffer(f.read(entry.n_bytes), dtype=np.uint8), dataclasses.replace(entry, offset=0))
            out[entry.name] = tuple(_floats(raw, entry).reshape(-1).tolist())
    return out


def hf_config(meta: dict, tensor_names: set[str], vectors: dict | None = None) -> dict:
    """HF config.json for the GGUF's metadata (the family's own keys from its registry entry);
    vectors: derived_values."""
    try:
        entry = gguf_architecture(meta.get("general.architecture"))
        tokens = vocabulary(meta)
        common = {
            "vocab_size": len(tokens),
            "tie_word_embeddings": "output.weight" not in tensor_names,
            "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
            "torch_dtype": "float32",
        }
        config = {**common, **entry.gguf.config(GGUFMeta(meta, frozenset(tensor_names), tokens, vectors or {}))}
        model_type = config.setdefault("model_type", entry.model_type)  # a family may say (llama's file of Mixtral)
        return {"architectures": [architecture(model_type).gguf.hf_class], **config}
    except ConfigError as e:
        raise GGUFError(str(e)) from None


def _unpermute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row interleaving: rows (head, pair, 2) back to (head, 2, pair)."""
    rows = weights.shape[0]
    w = weights.reshape(n_head, rows // n_head // 2, 2, *weights.shape[1:])  # (head, pair, 2, ...)
    return w.swapaxes(1, 2).reshape(weights.shape)  # (head, 2, pair, ...) -> (rows, ...)


def hf_tensor_name(name: str, arch: str = "llama") -> str:
    """llama.cpp tensor name → ours (HF's, where our modules follow them), by the GGUF architecture's
    table: "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; for "gpt2",
    "blk.3.attn_qkv.weight" -> "transformer.h.3.attn.c_attn.weight"."""
    try:
        return _our_name(name, gguf_architecture(arch).gguf)
    except ConfigError as e:
        raise GGUFError(str(e)) from None


def _our_name(name: str, layout: GGUFLayout) -> str:
    if name in layout.tensors:
        return layout.tensors[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layout.tensors:
        return f"{layout.block}{parts[1]}.{layout.tensors[parts[2]]}"
    raise GGUFError(f"GGUF tensor {name!r} has no HF equivalent in nexttok's table")


def _block(name: str) -> int:
    """The block a tensor belongs to ("blk.3.attn_q.weight": 3), -1 for the model's own tensors."""
    parts = name.split(".", 2)
    return int(parts[1]) if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() else -1
