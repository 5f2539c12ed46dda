"""HF checkpoint → GGUF, in llama.cpp's tensor names and metadata, so that llama.cpp runs the very same
weights side by side (the benchmark's llama.cpp column) and our GGUF path can be checked against the
checkpoint it came from. The reverse direction, GGUF → HF, is convert.py's.

    write_gguf("tiny-qwen3-moe/", "tiny.gguf", kind="Q8_0")

The model is loaded by our own loader (the family's renames and transforms applied, float32), then
written back out by the family's registry entry (models/registry.py): GGUFLayout.metadata gives the
metadata keys (the inverse of GGUFLayout.config), GGUFLayout.tensors the names; fused projections
are split into their parts again, stacked experts into llama.cpp's three 3-D tensors (two where the
layout keeps gate and up together: Gemma 4's), the q/k rows (and biases) of Llama-style families
interleaved as llama.cpp's converter does, Gemma's norms plus 1 (Qwen3-Next's too, its A_log as
-exp(A_log), Qwen3.5's value heads tiled: GGUFLayout.values, .rearrange), and the tensors llama.cpp
derives from the config added (Gemma 4's rope_freqs: .derived). Matrices are written in `kind` (F32,
F16, BF16, or a block type the `gguf` package quantizes: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4) where
their rows are whole blocks, as llama.cpp's converter does, and in F32 where not; norms, biases,
sinks and the routers stay F32. The tokenizer must be byte-level BPE.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from nexttok.checkpoints.gguf.metadata import GGUFError
from nexttok.checkpoints.gguf.tokenizer import LLAMA3_PATTERN, QWEN2_PATTERN, QWEN35_PATTERN
from nexttok.checkpoints.loading import load_model
from nexttok.models.architecture import GGUFLayout
from nexttok.models.config import ConfigError
from nexttok.models.fused import FusedLinear, fused_parts
from nexttok.models.registry import ARCHITECTURES, architecture, read_config
from nexttok.tokenizers.from_json import from_directory
from nexttok.tokenizers.tokenizer import Tokenizer

KINDS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4")
KEPT_F32 = ("norm.weight", ".bias", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight",
            "attn_sinks.weight", "exp_probs_b.bias")  # as llama.cpp's converter keeps them
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "BF16": 32, "MXFP4": 38}


def write_gguf(directory: str | Path, out: str | Path, kind: str = "F32") -> Path:
    """Write an HF checkpoint directory (any family whose registry entry has a GGUF layout) as a
    GGUF file with its byte-level BPE tokenizer and chat template."""
    import gguf  # the third-party package (absolute import), not nexttok.checkpoints.gguf.reader

    directory, out = Path(directory), Path(out)
    if kind not in KINDS:
        raise GGUFError(f"GGUF export kind must be one of {', '.join(KINDS)}, got {kind!r}")
    config = read_config(directory)
    layout = architecture(config.model_type).gguf
    if layout is None or layout.metadata is None:
        covered = ", ".join(t for t, a in ARCHITECTURES.items() if a.gguf is not None and a.gguf.metadata is not None)
        raise GGUFError(f"GGUF export does not cover {config.model_type!r} (it covers: {covered})")
    try:
        metadata = layout.metadata(config)
    except ConfigError as e:
        raise GGUFError(f"{directory}: {e}") from None
    tokenizer = from_directory(directory)
    model = load_model(directory, dtype="float32", device="cpu")
    writer = gguf.GGUFWriter(str(out), layout.arch)
    writer.add_file_type(FILE_TYPES[kind])
    for key, value in metadata.items():
        _add(writer, f"{layout.arch}.{key}", value)
    _write_tokenizer(writer, tokenizer, directory, config)
    for name, array in gguf_tensors(model, layout):
        _write_tensor(writer, name, array, kind)
    for name, derive in layout.derived.items():  # what llama.cpp's file holds beside the checkpoint's
        _write_tensor(writer, name, np.asarray(derive(config), dtype=np.float32), kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def gguf_tensors(model: torch.nn.Module, layout: GGUFLayout) -> Iterator[tuple[str, np.ndarray]]:
    """(llama.cpp's name, float32 array) of every weight of a loaded model, in the layout's names."""
    names = {ours: theirs for theirs, ours in layout.tensors.items()}
    tied = model.config.tie_word_embeddings
    whole = any(ours.endswith("experts.gate_up_proj") for ours in names)  # gemma4's ffn_gate_up_exps: kept whole
    for ours, value in _checkpoint_tensors(model, whole):
        if tied and ours == "lm_head.weight":
            continue
        value = value.detach().float()
        if any(ours.endswith(p) for p in layout.permuted):
            heads = model.config.num_attention_heads if ".q_proj." in ours else model.config.num_key_value_heads
            value = _permute(value, heads)
        if layout.norm_offset and ours.endswith("norm.weight"):
            value = value + layout.norm_offset
        array = value.numpy()
        stored = next((fn for suffix, (_, fn) in layout.values.items() if ours.endswith(suffix)), None)
        array = array if stored is None else stored(array)
        array = array if layout.rearrange is None else layout.rearrange(ours, array, model.config)
        yield _gguf_name(ours, names, layout), np.ascontiguousarray(array)


def _checkpoint_tensors(model: torch.nn.Module, whole_experts: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(our checkpoint name, tensor) of every parameter, fused projections split into their parts and
    stacked experts into their three 3-D tensors (mlp.experts.gate_proj.weight: (E, inner, hidden)), or
    whole_experts: kept as they are, gate and up together (experts.gate_up_proj: (E, 2 inner, hidden))."""
    for name, value in model.state_dict().items():
        module_name, leaf = name.rsplit(".", 1)
        module = model.get_submodule(module_name)
        if isinstance(module, FusedLinear):
            parts = fused_parts(module_name, module)
            yield from zip((f"{_prefixed(model, p)}.{leaf}" for p in parts), value.split(list(parts.values())),
                           strict=True)
        elif hasattr(module, "checkpoint_parts"):  # moe.Experts
            base = _prefixed(model, module_name)
            if whole_experts:
                yield _prefixed(model, name), value
            elif leaf.startswith("gate_up_proj"):
                gate, up = value.chunk(2, dim=1)
                kind = "bias" if leaf.endswith("bias") else "weight"
                yield from ((f"{base}.gate_proj.{kind}", gate), (f"{base}.up_proj.{kind}", up))
            else:
                yield f"{base}.down_proj.{'bias' if leaf.endswith('bias') else 'weight'}", value
        else:
            yield _prefixed(model, name), value


def _prefixed(model: torch.nn.Module, name: str) -> str:
    return name if name.startswith(model.UNPREFIXED) else model.CHECKPOINT_PREFIX + name


def _gguf_name(ours: str, names: dict[str, str], layout: GGUFLayout) -> str:
    """"model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight" (the layout's table, inverted)."""
    if ours in names:
        return names[ours]
    if ours.startswith(layout.block):
        layer, rest = ours[len(layout.block):].split(".", 1)
        if rest in names:
            return f"blk.{layer}.{names[rest]}"
    raise GGUFError(f"tensor {ours!r} has no name in llama.cpp's {layout.arch} layout")


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's interleaving of Llama's q/k rows for its RoPE kernel: rows (head, 2, pair) -> (head,
    pair, 2), as convert_hf_to_gguf's permute (the reader's _unpermute undoes it)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_tensor(writer, name: str, array: np.ndarray, kind: str) -> None:
    from gguf import GGMLQuantizationType, quants

    block = quants.GGML_QUANT_SIZES[GGMLQuantizationType[kind]][0] if kind not in ("F32", "F16", "BF16") else 1
    if array.ndim < 2 or name.endswith(KEPT_F32) or kind == "F32" or array.shape[-1] % block:
        writer.add_tensor(name, array.astype(np.float32))
    elif kind == "F16":
        writer.add_tensor(name, array.astype(np.float16))
    else:
        qtype = GGMLQuantizationType[kind]
        data = quants.quantize(array, qtype)  # (..., bytes per row)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)


def _add(writer, key: str, value) -> None:
    """One metadata value in the GGUF type llama.cpp reads it as (counts uint32, scales float32)."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        writer.add_array(key, list(value))
    else:
        raise GGUFError(f"GGUF metadata {key} has a value of type {type(value).__name__}")


def _write_tokenizer(writer, tokenizer: Tokenizer, directory: Path, config) -> None:
    """The vocabulary as llama.cpp's tokenizer.ggml.* keys: byte-level BPE ("gpt2") with its merges."""
    if not tokenizer.symbols.byte_level:
        raise GGUFError("GGUF export writes byte-level BPE tokenizers only (SentencePiece vocabularies need "
                        "scores and token types this writer does not derive)")
    tokens = [""] * config.vocab_size
    for token, i in tokenizer.vocab.items():
        if i < config.vocab_size:
            tokens[i] = token
    for t in tokenizer.added_tokens:
        if t.id < config.vocab_size:
            tokens[t.id] = t.content
    for i, token in enumerate(tokens):  # the embedding's rows past the vocabulary: llama.cpp wants a name each
        tokens[i] = token or f"[PAD{i}]"
    special = {t.id for t in tokenizer.added_tokens if t.special}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_tokenizer(directory))
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i in range(config.vocab_size)])
    writer.add_token_merges([f"{a} {b}" for (a, b) in tokenizer.merge_ranks])
    if config.eos_token_id:
        writer.add_eos_token_id(config.eos_token_id[0])
    if config.bos_token_id is not None:
        writer.add_bos_token_id(config.bos_token_id)
    template = _chat_template(directory)
    if template:
        writer.add_chat_template(template)


def _pre_tokenizer(directory: Path) -> str:
    """llama.cpp's tokenizer.ggml.pre for the directory's tokenizer.json split pattern (GPT-2's by default)."""
    path = directory / "tokenizer.json"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    for pattern, name in ((LLAMA3_PATTERN, "llama-bpe"), (QWEN2_PATTERN, "qwen2"), (QWEN35_PATTERN, "qwen35")):
        if json.dumps(pattern)[1:-1] in text:
            return name
    return "gpt-2"


def _chat_template(directory: Path) -> str | None:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return None
    template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
    return template if isinstance(template, str) else None
