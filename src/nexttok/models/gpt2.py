"""GPT-2.

ids ─wte + wpe(position)→ x ─N × [x += attn(LayerNorm(x)); x += MLP(LayerNorm(x))]→ LayerNorm ─lm_head→ logits

Learned absolute position embeddings, one fused c_attn projection for q/k/v, a GELU (tanh) MLP,
lm_head tied to the token embedding. HF stores the projections as Conv1D (in, out); the loader
transposes them into nn.Linear (out, in).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta
from nexttok.models.attention import attend_cached
from nexttok.models.compiled import CompiledDecode
from nexttok.models.config import ConfigError, ModelConfig, check_act
from nexttok.models.decoder import Decoder, empty_embedding

ACTIVATIONS = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
}


class Attention(nn.Module):
    PARALLEL_HEADS = ("c_attn", "c_proj")  # tensor parallelism (parallel_layers.py): heads split over ranks

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.head_dim = config.num_attention_heads, config.head_dim
        self.n_kv_head = self.n_head  # every head has keys and values of its own
        hidden = config.hidden_size
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)

    def forward(self, x, masks, cache, capture):
        b, t, _ = x.shape
        width = self.n_head * self.head_dim  # hidden; this rank's heads only under tensor parallelism
        q, k, v = self.c_attn(x).split(width, dim=2)  # each (B, T, width)
        q = q.view(b, t, self.n_head, self.head_dim).transpose(1, 2)  # (B, n_head, T, hd)
        k = k.view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        y = attend_cached(q, k, v, self.layer_idx, masks[None], cache, capture)  # (B, n_head, T, hd)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, width))


class MLP(nn.Module):
    PARALLEL_INNER = ("c_fc", "c_proj")  # tensor parallelism: the inner width split over ranks

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.hidden_size, config.intermediate_size)
        self.c_proj = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = ACTIVATIONS[config.hidden_act]

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        self.attn = Attention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, masks, cache, capture):
        x = x + self.attn(self.ln_1(x), masks, cache, capture)
        return x + self.mlp(self.ln_2(x))


class GPT2(Decoder):
    # checkpoint tensor name = CHECKPOINT_PREFIX + our name (old checkpoints omit the prefix)
    POSITIONS = "learned"  # a learned vector per position (wpe), added to the token embedding
    CHECKPOINT_PREFIX = "transformer."
    UNPREFIXED = ("lm_head.",)
    TRANSPOSED = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")  # HF Conv1D is (in, out)
    PARALLEL_VOCAB = ("wte", "lm_head")  # tensor parallelism: vocabulary rows split over ranks

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.wte = empty_embedding(config.vocab_size, config.hidden_size)
        self.wpe = empty_embedding(config.max_position_embeddings, config.hidden_size)
        self.h = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.compiled: CompiledDecode | None = None  # compiled.compile_decode turns it on

    def inverse_frequencies(self) -> torch.Tensor | None:
        """None: GPT-2's positions are a learned table (position_table), not rotations."""
        return None

    def position_table(self) -> torch.Tensor | None:
        """The learned position vectors (max_positions, hidden), added to the embeddings."""
        return self.wpe.weight

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.wte.weight

    def init_buffers(self) -> None:
        """GPT-2 has no computed buffers."""

    @property
    def blocks(self) -> nn.ModuleList:
        return self.h

    @property
    def final_norm(self) -> nn.Module:
        return self.ln_f

    def window_of(self, block: nn.Module) -> None:
        return None  # every block attends to all earlier positions

    def inputs(self, ids: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
        """Token embeddings plus the learned position vectors (padding, -1, takes position 0's)."""
        return self.embed(ids) + self.wpe(q_pos.clamp(min=0))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (B, T, hidden), before the position embedding is added."""
        return self.wte(ids)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from a residual stream (..., hidden): the final LayerNorm, then lm_head."""
        return self.lm_head(self.ln_f(x))


def fields(hf: dict) -> dict:
    """GPT-2's config.json: its own key names (n_embd, n_layer, ...) read into the canonical ones."""
    for key, ok in (("scale_attn_by_inverse_layer_idx", False), ("reorder_and_upcast_attn", False),
                    ("scale_attn_weights", True), ("add_cross_attention", False)):
        if hf.get(key, ok) != ok:
            raise ConfigError(f"GPT-2 option {key}={hf[key]!r} is not supported")
    hidden = hf["n_embd"]
    return dict(
        vocab_size=hf["vocab_size"], hidden_size=hidden, num_hidden_layers=hf["n_layer"],
        num_attention_heads=hf["n_head"], num_key_value_heads=hf["n_head"],
        intermediate_size=hf.get("n_inner") or 4 * hidden, max_position_embeddings=hf["n_positions"],
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        hidden_act=check_act(hf.get("activation_function", "gelu_new"), tuple(ACTIVATIONS)),
        attention_bias=True, o_proj_bias=True, mlp_bias=True,
        tie_word_embeddings=hf.get("tie_word_embeddings", True),
    )


def gguf_config(meta: GGUFMeta) -> dict:
    """config.json keys from llama.cpp's GPT-2 metadata."""
    return {"n_embd": meta.key("embedding_length"), "n_layer": meta.key("block_count"),
            "n_head": meta.key("attention.head_count"), "n_inner": meta.key("feed_forward_length"),
            "n_positions": meta.key("context_length"), "activation_function": "gelu_new",
            "layer_norm_epsilon": meta.key("attention.layer_norm_epsilon")}


def gguf_metadata(config: ModelConfig) -> dict:
    """gguf_config's inverse."""
    return {"context_length": config.max_position_embeddings, "embedding_length": config.hidden_size,
            "feed_forward_length": config.intermediate_size, "block_count": config.num_hidden_layers,
            "attention.head_count": config.num_attention_heads,
            "attention.layer_norm_epsilon": float(config.norm_eps)}


# llama.cpp's convert_hf_to_gguf transposes HF's Conv1D (in, out) weights to (out, in); newer files
# leave output.weight out: the output layer is then tied to token_embd
GGUF_TENSORS = {  # per block: "blk.N." → "transformer.h.N."
    "token_embd.weight": "transformer.wte.weight",
    "position_embd.weight": "transformer.wpe.weight",
    "output_norm.weight": "transformer.ln_f.weight", "output_norm.bias": "transformer.ln_f.bias",
    "output.weight": "lm_head.weight",
    **{f"{gguf}.{kind}": f"{hf}.{kind}" for gguf, hf in (
        ("attn_norm", "ln_1"), ("attn_qkv", "attn.c_attn"), ("attn_output", "attn.c_proj"),
        ("ffn_norm", "ln_2"), ("ffn_up", "mlp.c_fc"), ("ffn_down", "mlp.c_proj")) for kind in ("weight", "bias")},
}

ARCHITECTURES = (Architecture("gpt2", GPT2, fields, GGUFLayout("gpt2", gguf_config, GGUF_TENSORS, "transformer.h.",
                                                              hf_class="GPT2LMHeadModel",
                                                              metadata=gguf_metadata)),)
