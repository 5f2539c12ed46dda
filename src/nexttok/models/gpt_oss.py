"""gpt-oss (gpt-oss-20b, gpt-oss-120b): attention with sinks, sliding and full layers in turn, YaRN
RoPE, biases everywhere, and a mixture of experts with a clamped SwiGLU.

ids ─embed_tokens→ x ─N × [x += attn(RMSNorm(x)); x += MoE(RMSNorm(x))]→ RMSNorm ─lm_head→ logits

    attn: q/k/v/o with biases; every head has a learned sink, a logit that joins the softmax as if
          one more key (with no value) so a query may attend to nothing; even layers see only the
          last sliding_window (128) keys, odd layers all of them (config.layer_types)
    RoPE: YaRN (factor 32 over 4,096 positions), cos and sin scaled by its attention factor
    MoE:  router logits with a bias, the num_experts_per_tok (4) largest of num_local_experts
          (32 or 128), softmax over those four; each expert down(h) + bias with
          h = gate·σ(1.702·gate)·(up + 1), gate clamped above at 7, up to ±7, gate_up with a bias

The checkpoint keeps the experts as 3-D tensors (E, hidden, 2·inner) with gate and up columns
interleaved, and (E, inner, hidden): transposed and de-interleaved as they are read into our
(E, 2·inner, hidden) gate-then-up layout. (The official checkpoints store the experts in MXFP4
blocks in safetensors; those load from their GGUF files, which llama.cpp writes in MXFP4 too.)
"""

from __future__ import annotations

import torch

from nexttok.models import llama, moe
from nexttok.models.architecture import Architecture, GGUFLayout, GGUFMeta, representable
from nexttok.models.config import ModelConfig, positive_number


class GptOssLayer(llama.DecoderLayer):
    moe_class = moe.SparseMoE


class GptOss(llama.Llama):
    LAYER = GptOssLayer


def fields(hf: dict) -> dict:
    layers = hf["num_hidden_layers"]
    hf = {**hf, "hidden_act": "silu", "head_dim": hf.get("head_dim", 64)}
    hf.setdefault("rope_parameters", hf.get("rope_scaling") or {
        "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096})
    out = llama.fields(hf, "gpt_oss")
    bias = bool(hf.get("attention_bias", True))
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    return {**out, **moe.fields(hf, experts="num_local_experts", inner=None, router="topk_softmax"),
            "hidden_act": "swiglu_oai", "attention_bias": bias, "o_proj_bias": bias, "attention_sinks": True,
            "router_bias": True, "layer_types": types, "sliding_window": hf.get("sliding_window", 128),
            "swiglu_alpha": positive_number(hf, "swiglu_alpha", 1.702),
            "swiglu_limit": positive_number(hf, "swiglu_limit", 7.0)}


def _gate_up(w: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """(E, hidden, 2·inner), gate and up columns interleaved -> (E, 2·inner, hidden), gate rows then up."""
    w = w.transpose(1, 2)
    return torch.cat((w[:, 0::2], w[:, 1::2]), dim=1)


def _gate_up_bias(b: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """(E, 2·inner) interleaved -> gate then up."""
    return torch.cat((b[:, 0::2], b[:, 1::2]), dim=1)


RENAMES = ((".mlp.router.", ".mlp.gate."),)
TRANSFORMS = {"mlp.experts.gate_up_proj": _gate_up, "mlp.experts.gate_up_proj_bias": _gate_up_bias,
              "mlp.experts.down_proj": lambda w, config: w.transpose(1, 2)}

def gguf_config(meta: GGUFMeta) -> dict:
    """llama.cpp's gpt-oss: expert_feed_forward_length is each expert's width; the layers slide as
    attention.sliding_window_pattern says, else every even one (as llama.cpp's default); swiglu's
    alpha and limit are llama.cpp's constants (HF's defaults)."""
    config = {**llama.gguf_config(meta), **moe.gguf_config(meta, "num_local_experts"),
              "intermediate_size": meta.key("expert_feed_forward_length"),
              "sliding_window": meta.key("attention.sliding_window"), "attention_bias": True}
    pattern = meta.get("attention.sliding_window_pattern")
    layers = config["num_hidden_layers"]
    sliding = list(pattern) if pattern is not None else [i % 2 == 0 for i in range(layers)]
    config["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
    # as rope_parameters, which fields reads before gpt-oss's own default (YaRN)
    scaling = config.pop("rope_scaling", {"rope_type": "default"})
    config["rope_parameters"] = {**scaling, "rope_theta": config["rope_theta"]}
    return config


def gguf_metadata(config: ModelConfig) -> dict:
    representable((config.swiglu_alpha, config.swiglu_limit) == (1.702, 7.0),
                  "a clamped SwiGLU other than alpha 1.702, limit 7 (llama.cpp's constants)")
    representable(config.attention_bias and config.o_proj_bias and not config.tie_word_embeddings,
                  "a gpt-oss without attention biases, or with tied embeddings")
    out = {**llama.gguf_metadata(config), **moe.gguf_metadata(config),
           "attention.sliding_window": config.sliding_window, "feed_forward_length": config.moe_intermediate_size}
    if config.layer_types != ["sliding_attention" if i % 2 == 0 else "full_attention"
                              for i in range(config.num_hidden_layers)]:
        out["attention.sliding_window_pattern"] = [t == "sliding_attention" for t in config.layer_types]
    return out


GGUF_TENSORS = {
    **{k: v for k, v in llama.GGUF_TENSORS.items() if k != "ffn_norm.weight"}, **moe.GGUF_TENSORS,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.bias": "mlp.gate.bias",
    **{f"ffn_{p}_exps.bias": f"mlp.experts.{p}_proj.bias" for p in ("gate", "up", "down")},
}

ARCHITECTURES = (
    Architecture("gpt_oss", GptOss, fields,
                 GGUFLayout("gpt-oss", gguf_config, GGUF_TENSORS, hf_class="GptOssForCausalLM", metadata=gguf_metadata),
                 renames=RENAMES, transforms=TRANSFORMS),
)
