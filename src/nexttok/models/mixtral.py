"""Mixtral (8x7B, 8x22B): Mistral's attention and a mixture of experts in place of the MLP.

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += MoE(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

    MoE: softmax over the router's logits, the num_experts_per_tok (2) most likely of
         num_local_experts (8), renormalised to sum to 1; each expert a SwiGLU of intermediate_size

The checkpoint calls the MoE block_sparse_moe and an expert's projections w1 (gate), w3 (up) and
w2 (down): renamed as they are read. A sliding_window, where set, applies to every layer.
"""

from __future__ import annotations

from nexttok.models import llama, moe
from nexttok.models.architecture import Architecture, GGUFLayout, representable
from nexttok.models.config import ModelConfig


class MixtralLayer(llama.DecoderLayer):
    moe_class = moe.SparseMoE


class Mixtral(llama.Llama):
    LAYER = MixtralLayer


def fields(hf: dict) -> dict:
    return {**llama.fields(hf, "mixtral"), **moe.fields(hf, experts="num_local_experts", inner=None, norm=True)}


RENAMES = ((".block_sparse_moe.", ".mlp."), (".w1.", ".gate_proj."), (".w3.", ".up_proj."), (".w2.", ".down_proj."))

def gguf_metadata(config: ModelConfig) -> dict:
    """llama.cpp writes Mixtral as a llama file with experts (feed_forward_length: each expert's)."""
    representable(config.sliding_window is None, "a sliding window in a llama file")
    return {**llama.gguf_metadata(config), **moe.gguf_metadata(config)}


# read through llama's entry (its gguf_config says model_type mixtral where the file has experts)
GGUF = GGUFLayout("llama", llama.gguf_config, {**llama.GGUF_TENSORS, **moe.GGUF_TENSORS}, permuted=llama.QK_PERMUTED,
                  hf_class="MixtralForCausalLM", metadata=gguf_metadata)

ARCHITECTURES = (Architecture("mixtral", Mixtral, fields, GGUF, renames=RENAMES),)
