"""HF GPT-2 checkpoint → GGUF (float32), so llama.cpp can run the very same weights side by side
(the benchmark's llama.cpp column). The reverse direction, GGUF → HF, is convert.py's.
"""

from __future__ import annotations

from pathlib import Path

from nexttok.checkpoints.gguf.reader import GGUFError
from nexttok.checkpoints.weights import checkpoint_files
from nexttok.models.registry import read_config
from nexttok.tokenizers.from_json import from_directory

_GPT2_TO_GGUF = {
    "wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
    "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias",
    "ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
    "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down",
}


def _gguf_gpt2_name(name: str) -> str | None:
    """HF GPT-2 tensor name → llama.cpp's: "h.3.attn.c_attn.weight" -> "blk.3.attn_qkv.weight"."""
    name = name.removeprefix("transformer.")
    if name in _GPT2_TO_GGUF:
        return _GPT2_TO_GGUF[name]
    parts = name.split(".")
    if len(parts) >= 4 and parts[0] == "h" and parts[1].isdigit():
        module, kind = ".".join(parts[2:-1]), parts[-1]
        if module in _GPT2_TO_GGUF:
            return f"blk.{parts[1]}.{_GPT2_TO_GGUF[module]}.{kind}"
    return None  # buffers such as attn.bias (the causal mask) have no GGUF counterpart


def write_gguf_gpt2(directory: str | Path, out: str | Path) -> Path:
    """Write a GGUF (float32) of an HF GPT-2 checkpoint directory with its tokenizer."""
    import gguf  # the third-party package (absolute import), not nexttok.checkpoints.gguf.reader
    import numpy as np
    from safetensors.numpy import load_file

    directory, out = Path(directory), Path(out)
    config = read_config(directory)
    if config.model_type != "gpt2":
        raise GGUFError(f"GGUF export supports GPT-2 checkpoints only, not {config.model_type!r}")
    tokenizer = from_directory(directory)
    writer = gguf.GGUFWriter(str(out), "gpt2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_layer_norm_eps(config.norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = [""] * config.vocab_size
    for token, i in tokenizer.vocab.items():
        tokens[i] = token
    special = {t.id for t in tokenizer.added_tokens if t.special}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i in range(config.vocab_size)])
    writer.add_token_merges([f"{a} {b}" for (a, b) in tokenizer.merge_ranks])
    if config.eos_token_id:
        writer.add_eos_token_id(config.eos_token_id[0])
        writer.add_bos_token_id(config.bos_token_id if config.bos_token_id is not None else config.eos_token_id[0])
    for path in checkpoint_files(directory):
        for name, array in load_file(str(path)).items():
            target = _gguf_gpt2_name(name)
            if target is None:
                continue
            if name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
                array = array.T  # HF Conv1D (in, out) → (out, in)
            array = np.ascontiguousarray(array, dtype=np.float32)
            writer.add_tensor(target, array)
            if target == "token_embd.weight":
                writer.add_tensor("output.weight", array)  # GPT-2's output is tied to wte
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
