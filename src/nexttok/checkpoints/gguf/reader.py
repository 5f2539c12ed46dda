"""Reading a GGUF file (llama.cpp's format): its config, its tokenizer and its tensors, in HF's terms.

A GGUF holds the weights, often quantized, and the tokenizer as metadata. Parsing the file and
dequantizing blocks is the third-party `gguf` package's job (imported when a file is opened;
gguf_metadata.py checks the file is whole and caches what was parsed); the mapping is ours:

- config: llama.cpp metadata keys → HF config.json keys
- tokenizer: tokens/merges or scores/token types → tokenizer.json (+ its config): gguf_tokenizer.py
- tensors: llama.cpp names → HF names; llama.cpp stores Q and K rows interleaved for its RoPE
  kernel (convert_hf_to_gguf permutes them), so they are permuted back; it stores Gemma's RMSNorm
  weights as 1 + w (its kernel multiplies by the weight), so 1 is taken off again
- Gemma 3: the file holds no local RoPE theta and no layer pattern; llama.cpp hard-codes them
  (src/llama-model.cpp, LLM_ARCH_GEMMA3: every 6th layer global, local theta 10000, scores scaled
  by 1/√head_dim, by 1/√(hidden/heads) for the 62-layer 27B), and so does hf_config

    gguf = read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    gguf.config["num_hidden_layers"] == 30; dict(gguf.tensors())["model.norm.weight"].shape == (576,)
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nexttok.checkpoints.gguf.metadata import GGUFError, TensorEntry, read_metadata
from nexttok.checkpoints.gguf.tokenizer import LLAMA3_PATTERN as LLAMA3_PATTERN  # re-exported for tests
from nexttok.checkpoints.gguf.tokenizer import QWEN2_PATTERN as QWEN2_PATTERN
from nexttok.checkpoints.gguf.tokenizer import hf_tokenizer, vocabulary

if TYPE_CHECKING:
    import numpy as np

SUPPORTED_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gpt2": "GPT2LMHeadModel",
                           "gemma3": "Gemma3ForCausalLM"}
MODEL_TYPES = {"gemma3": "gemma3_text"}  # GGUF architecture → HF model_type, where they differ
GEMMA3_SLIDING_PATTERN, GEMMA3_LOCAL_THETA = 6, 10000.0  # llama.cpp's constants for LLM_ARCH_GEMMA3

TENSOR_NAMES = {  # llama.cpp → HF (per block: "blk.N." → "model.layers.N.")
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

# GPT-2 (llama.cpp's convert_hf_to_gguf transposes HF's Conv1D (in, out) weights to (out, in);
# newer files leave output.weight out: the output layer is then tied to token_embd)
GPT2_TENSOR_NAMES = {  # per block: "blk.N." → "transformer.h.N."
    "token_embd.weight": "transformer.wte.weight",
    "position_embd.weight": "transformer.wpe.weight",
    "output_norm.weight": "transformer.ln_f.weight", "output_norm.bias": "transformer.ln_f.bias",
    "output.weight": "lm_head.weight",
    **{f"{gguf}.{kind}": f"{hf}.{kind}" for gguf, hf in (
        ("attn_norm", "ln_1"), ("attn_qkv", "attn.c_attn"), ("attn_output", "attn.c_proj"),
        ("ffn_norm", "ln_2"), ("ffn_up", "mlp.c_fc"), ("ffn_down", "mlp.c_proj")) for kind in ("weight", "bias")},
}
# Gemma 3: a norm before and after both attention and MLP, and one on each q and k head
GEMMA3_TENSOR_NAMES = {
    **TENSOR_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
}
_TABLES = {"gpt2": (GPT2_TENSOR_NAMES, "transformer.h."), "gemma3_text": (GEMMA3_TENSOR_NAMES, "model.layers."),
           "default": (TENSOR_NAMES, "model.layers.")}


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
        arch = self.config["model_type"]
        permute, gemma = arch == "llama", arch == "gemma3_text"
        for entry in self.entries:
            name, kind, raw = hf_tensor_name(entry.name, arch), entry.kind, _raw(data, entry)
            place = (mapping, entry.offset)
            if permute and ".q_proj.weight" in name:
                raw, place = _unpermute(raw, self.config["num_attention_heads"]), None
            elif permute and ".k_proj.weight" in name:
                raw, place = _unpermute(raw, self.config["num_key_value_heads"]), None
            elif gemma and name.endswith("norm.weight"):
                (kind, raw), place = ("F32", _less_one(raw, entry)), None
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
        """The values as float32, in HF's shape."""
        import numpy as np
        from gguf import GGMLQuantizationType, quants

        try:
            array = quants.dequantize(self.raw, GGMLQuantizationType[self.kind])
        except Exception as e:
            raise GGUFError(f"cannot dequantize GGUF tensor {self.name!r} ({self.kind}): {e}") from None
        return np.ascontiguousarray(array.reshape(self.shape), dtype=np.float32)


def _less_one(raw: np.ndarray, entry: TensorEntry) -> np.ndarray:
    """A Gemma norm weight as HF stores it: llama.cpp's convert_hf_to_gguf added 1 to it."""
    if entry.kind not in ("F32", "F16"):
        raise GGUFError(f"GGUF norm tensor {entry.name!r} is {entry.kind}; Gemma norms are expected as F32 or F16")
    return raw.astype("float32") - 1.0  # float32 whatever it was stored as: 1 + w in float16 lost bits already


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
    config = hf_config(meta, {e.name for e in entries})
    tokenizer, tokenizer_config = hf_tokenizer(meta)
    return GGUFFile(path, config, tokenizer, tokenizer_config, entries)


def read_gguf_tokenizer(path: str | Path, index_dir: Path | None = None) -> tuple[dict, dict]:
    """(tokenizer.json, tokenizer_config.json) of a GGUF file, whatever its architecture and
    whether or not it holds weights: only the tokenizer metadata is mapped."""
    return hf_tokenizer(read_metadata(Path(path), index_dir)[0])


def hf_config(meta: dict, tensor_names: set[str]) -> dict:
    """HF config.json for the GGUF's metadata."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"GGUF architecture {arch!r} is not supported "
                        f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def key(name, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise GGUFError(f"GGUF metadata {arch}.{name} is missing")
        return value

    common = {
        "architectures": [SUPPORTED_ARCHITECTURES[arch]], "model_type": MODEL_TYPES.get(arch, arch),
        "vocab_size": len(vocabulary(meta)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    if arch == "gpt2":
        return {**common, "n_embd": key("embedding_length"), "n_layer": key("block_count"),
                "n_head": key("attention.head_count"), "n_inner": key("feed_forward_length"),
                "n_positions": key("context_length"), "activation_function": "gelu_new",
                "layer_norm_epsilon": key("attention.layer_norm_epsilon")}
    if arch == "gemma3":
        return {**common, **_gemma3_config(meta, arch, key, tensor_names)}
    return {**common, **_llama_config(meta, arch, key, tensor_names)}


def _llama_config(meta: dict, arch: str, key, tensor_names: set[str]) -> dict:
    hidden, heads = key("embedding_length"), key("attention.head_count")
    head_dim = meta.get(f"{arch}.attention.key_length", hidden // heads)
    if meta.get(f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise GGUFError("partial rotary embeddings (rope.dimension_count != head dim) are not supported")
    if "rope_freqs.weight" in tensor_names:
        raise GGUFError("GGUF rope_freqs (Llama 3.1 style frequency factors) are not supported yet")
    config = {
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"), "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads, "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": head_dim, "max_position_embeddings": key("context_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_theta": key("rope.freq_base", 10000.0), "hidden_act": "silu",
    }
    if meta.get(f"{arch}.rope.scaling.type", "none") not in ("none", None):
        kind = meta[f"{arch}.rope.scaling.type"]
        if kind != "linear":
            raise GGUFError(f"GGUF rope scaling {kind!r} is not supported")
        config["rope_scaling"] = {"rope_type": "linear", "factor": key("rope.scaling.factor")}
    return config


def _gemma3_config(meta: dict, arch: str, key, tensor_names: set[str]) -> dict:
    """Gemma 3 text as llama.cpp runs it: what the file leaves out is llama.cpp's constant (see the
    module docstring); as in llama.cpp, no metadata key overrides those."""
    config = _llama_config(meta, arch, key, tensor_names)
    layers, heads, pattern = config["num_hidden_layers"], config["num_attention_heads"], GEMMA3_SLIDING_PATTERN
    del config["hidden_act"]
    tokens = vocabulary(meta)
    # llama.cpp ends a turn at <end_of_turn> too (gemma-3's generation_config.json: eos [1, 106])
    end_of_turn = tokens.index("<end_of_turn>") if "<end_of_turn>" in tokens else None
    stops = [meta.get("tokenizer.ggml.eos_token_id"), end_of_turn]
    return {
        **config, "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": key("attention.sliding_window"),
        "layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)],
        "rope_local_base_freq": GEMMA3_LOCAL_THETA,
        "query_pre_attn_scalar": config["hidden_size"] // heads if layers == 62 else config["head_dim"],
        "final_logit_softcapping": None, "attn_logit_softcapping": None,  # llama.cpp applies neither to Gemma 3
        "eos_token_id": [i for i in dict.fromkeys(stops) if i is not None],
    }


def _unpermute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row interleaving: rows (head, pair, 2) back to (head, 2, pair)."""
    rows = weights.shape[0]
    w = weights.reshape(n_head, rows // n_head // 2, 2, *weights.shape[1:])  # (head, pair, 2, ...)
    return w.swapaxes(1, 2).reshape(weights.shape)  # (head, 2, pair, ...) -> (rows, ...)


def hf_tensor_name(name: str, arch: str = "llama") -> str:
    """llama.cpp tensor name → HF: "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight";
    for GPT-2, "blk.3.attn_qkv.weight" -> "transformer.h.3.attn.c_attn.weight"."""
    table, block = _TABLES.get(arch, _TABLES["default"])
    if name in table:
        return table[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in table:
        return f"{block}{parts[1]}.{table[parts[2]]}"
    raise GGUFError(f"GGUF tensor {name!r} has no HF equivalent in nexttok's table")
