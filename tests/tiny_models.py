"""Tiny random HF checkpoints written with save_pretrained: the oracle for the model tests."""

from __future__ import annotations

from pathlib import Path

VOCAB = 128

COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=96, max_position_embeddings=256)

PHI3_IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)  # Phi3Config's defaults lie outside VOCAB
SMOLLM3_IDS = PHI3_IDS  # so do SmolLM3Config's
PHI3_LONGROPE = dict(max_position_embeddings=64, original_max_position_embeddings=32, rope_scaling={
    "rope_type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
    "long_factor": [1.2, 1.9, 2.8, 4.0, 5.5, 7.3, 9.4, 12.0]})

LINEAR_ATTENTION = dict(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_num_key_heads=2,
                        linear_num_value_heads=4)

# name -> (HF config class name, kwargs)
SPECS = {
    "gpt2": ("GPT2Config", dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                bos_token_id=0, eos_token_id=1)),
    "llama_gqa_llama3_rope": ("LlamaConfig", dict(
        COMMON, num_key_value_heads=2, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "llama_linear_rope_tied_bias": ("LlamaConfig", dict(
        COMMON, num_key_value_heads=4, rope_scaling={"rope_type": "linear", "factor": 4.0},
        tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
    "llama_head_dim": ("LlamaConfig", dict(COMMON, num_key_value_heads=1, head_dim=32)),
    "qwen2_sliding": ("Qwen2Config", dict(COMMON, num_key_value_heads=2, use_sliding_window=True,
                                          sliding_window=6, max_window_layers=1)),
    "qwen2": ("Qwen2Config", dict(COMMON, num_key_value_heads=2, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", dict(COMMON, num_key_value_heads=2, sliding_window=5)),
    "llama_long_context": ("LlamaConfig", dict(COMMON, num_key_value_heads=2, max_position_embeddings=4096,
                                               bos_token_id=50256, eos_token_id=50256)),
    # q/k norms; head_dim apart from hidden / heads
    "qwen3": ("Qwen3Config", dict(COMMON, num_key_value_heads=2, head_dim=32)),
    "qwen3_sliding_bias_tied": ("Qwen3Config", dict(
        COMMON, num_key_value_heads=1, head_dim=16, use_sliding_window=True, sliding_window=6, max_window_layers=1,
        attention_bias=True, tie_word_embeddings=True)),
    # fused qkv_proj / gate_up_proj tensors, a window on every layer (as Phi-3-mini-4k)
    "phi3": ("Phi3Config", dict(COMMON, num_key_value_heads=2, sliding_window=7, **PHI3_IDS)),
    # LongRoPE within the original context (the long factors: test_architectures.py), and
    # partial rotary + tied embeddings as Phi-4-mini
    "phi3_longrope": ("Phi3Config", dict(COMMON, num_key_value_heads=2, **PHI3_LONGROPE, **PHI3_IDS)),
    "phi3_partial_rotary_tied": ("Phi3Config", dict(
        COMMON, num_key_value_heads=1, tie_word_embeddings=True, **PHI3_IDS,
        **dict(PHI3_LONGROPE, rope_scaling=dict(PHI3_LONGROPE["rope_scaling"], partial_rotary_factor=0.5,
                                                short_factor=[1.0, 1.3, 1.9, 2.2], long_factor=[1.1, 2.0, 4.0, 8.0])))),
    # head_dim 256 as the real models, local/global layers with their own RoPE (global: linear
    # scaling as gemma-3-4b), a window the tests' prompts exceed
    "gemma3": ("Gemma3TextConfig", dict(
        COMMON, num_key_value_heads=1, head_dim=256, sliding_window=5, num_hidden_layers=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], query_pre_attn_scalar=256,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0}})),
    # query_pre_attn_scalar != head_dim (as gemma-3-27b), final logit soft-capping, untied;
    # attn_logit_softcapping set, which HF's Gemma 3 ignores (and so do we)
    "gemma3_softcap_scalar": ("Gemma3TextConfig", dict(
        COMMON, num_key_value_heads=2, head_dim=32, sliding_window=6,
        layer_types=["full_attention", "sliding_attention"], query_pre_attn_scalar=24,
        final_logit_softcapping=3.0, attn_logit_softcapping=1.0, tie_word_embeddings=False)),
    # dense families of 2025: NoPE layers (SmolLM3: every 2nd here; sliding where use_sliding_window),
    # norms after the sublayers with q/k norms over all heads (OLMo 2/3; OLMo 3's sliding layers with
    # their own RoPE, the full ones YaRN-scaled), Granite's multipliers, EXAONE 4 (per-head q/k norms,
    # sliding layers with RoPE, global ones without)
    "smollm3": ("SmolLM3Config", dict(COMMON, num_hidden_layers=4, num_key_value_heads=2, no_rope_layer_interval=2,
                                      attention_bias=True, tie_word_embeddings=False, **SMOLLM3_IDS)),
    "smollm3_sliding": ("SmolLM3Config", dict(COMMON, num_hidden_layers=3, num_key_value_heads=2, **SMOLLM3_IDS,
                                              no_rope_layer_interval=3, use_sliding_window=True, sliding_window=5)),
    # SmolLM3's own NoPE interval (4), which llama.cpp hard-codes: the one its GGUF holds
    "smollm3_every4": ("SmolLM3Config", dict(COMMON, num_hidden_layers=4, num_key_value_heads=2, **SMOLLM3_IDS)),
    "olmo2": ("Olmo2Config", dict(COMMON, num_key_value_heads=2, eos_token_id=2, pad_token_id=1)),
    "olmo3": ("Olmo3Config", dict(
        COMMON, num_hidden_layers=3, num_key_value_heads=2, sliding_window=5, eos_token_id=2, pad_token_id=1,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                         "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                            "original_max_position_embeddings": 32}})),
    "granite": ("GraniteConfig", dict(COMMON, num_key_value_heads=2, embedding_multiplier=3.0, residual_multiplier=0.4,
                                      attention_multiplier=0.15, logits_scaling=2.5, attention_bias=True)),
    "exaone4": ("Exaone4Config", dict(COMMON, num_hidden_layers=3, num_key_value_heads=2, sliding_window=5,
                                      sliding_window_pattern=3)),
    # hybrids: short convolutions (a recurrent state) between attention layers (LFM2); the MLP's
    # width adjusted as LFM2's (two thirds, rounded up to block_multiple_of)
    "lfm2": ("Lfm2Config", dict(COMMON, num_hidden_layers=4, num_key_value_heads=2, conv_L_cache=3, eos_token_id=2,
                                pad_token_id=0, bos_token_id=1, block_multiple_of=16,
                                layer_types=["conv", "full_attention", "conv", "conv"])),
    # Gemma 4 (models/gemma4.py), as gemma-4-E2B: per-layer inputs, the last 2 layers KV-shared (a sliding
    # one borrowing layer 2's keys, a full one layer 1's) with double-wide MLPs, full layers with heads of
    # twice the size and proportional RoPE (a quarter of the pairs turn, scaled), a window the prompts
    # exceed, the final soft cap
    "gemma4": ("Gemma4TextConfig", dict(
        COMMON, num_hidden_layers=5, num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                     "full_attention"], num_kv_shared_layers=2, use_double_wide_mlp=True,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB, final_logit_softcapping=3.0,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "factor": 2.0, "rope_theta": 10000.0}})),
    # as gemma-4-31B: full layers with one KV head whose keys are also the values, no per-layer inputs,
    # no sharing, untied
    "gemma4_k_eq_v": ("Gemma4TextConfig", dict(
        COMMON, num_hidden_layers=3, num_key_value_heads=2, head_dim=16, global_head_dim=32,
        num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=6, hidden_size_per_layer_input=0,
        layer_types=["sliding_attention", "full_attention", "full_attention"], tie_word_embeddings=False)),
    # as gemma-4-26B-A4B: experts beside the dense MLP on every layer (Gemma 4's own router)
    "gemma4_moe": ("Gemma4TextConfig", dict(
        COMMON, num_hidden_layers=2, num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=6,
        hidden_size_per_layer_input=0, layer_types=["sliding_attention", "full_attention"],
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)),
    # gated DeltaNet (a recurrent state) between gated attention layers: Qwen3-Next with experts, a shared
    # expert and a dense layer; Qwen3.5 dense (tied) and with experts; value heads twice the key heads,
    # d_v apart from d_k, a quarter of each attention head rotated
    "qwen3_next": ("Qwen3NextConfig", dict(
        COMMON, num_hidden_layers=4, num_key_value_heads=2, head_dim=16, **LINEAR_ATTENTION,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        mlp_only_layers=[2], eos_token_id=2, pad_token_id=0, bos_token_id=1)),
    "qwen3_5": ("Qwen3_5TextConfig", dict(COMMON, num_hidden_layers=4, num_key_value_heads=1, head_dim=32,
                                          **LINEAR_ATTENTION, tie_word_embeddings=True, eos_token_id=2)),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", dict(
        {k: v for k, v in COMMON.items() if k != "intermediate_size"}, num_hidden_layers=4, num_key_value_heads=2,
        head_dim=16, **LINEAR_ATTENTION, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, eos_token_id=2)),
    # mixtures of experts (models/moe.py): each family's router, a dense layer where the family has
    # them, and what else differs (shared experts, biases, sinks, windows, multipliers)
    "qwen3_moe": ("Qwen3MoeConfig", dict(
        COMMON, num_hidden_layers=3, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True)),
    # what llama.cpp's qwen3moe cannot hold: weights not renormalised, a dense layer, biases, head_dim
    # apart from hidden / heads
    "qwen3_moe_unnormed": ("Qwen3MoeConfig", dict(
        COMMON, num_key_value_heads=1, head_dim=32, num_experts=4, num_experts_per_tok=3, moe_intermediate_size=32,
        norm_topk_prob=False, decoder_sparse_step=2, attention_bias=True)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(
        COMMON, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48)),
    "mixtral": ("MixtralConfig", dict(COMMON, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    "olmoe": ("OlmoeConfig", dict(COMMON, num_key_value_heads=4, num_experts=8, num_experts_per_tok=2,
                                  eos_token_id=2, pad_token_id=1)),
    # YaRN over a 32-token original context (factor 4, its correction range rounded as llama.cpp does);
    # a window the prompts exceed, on the layers that layer_types says (not llama.cpp's default pattern)
    "gpt_oss": ("GptOssConfig", dict(
        COMMON, num_hidden_layers=3, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=5, layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True,
                         "original_max_position_embeddings": 32, "rope_theta": 10000.0})),
    # gpt-oss's own YaRN (truncate false, which llama.cpp cannot hold) and layer pattern
    "gpt_oss_untruncated": ("GptOssConfig", dict(
        COMMON, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 32, "rope_theta": 10000.0})),
    # a dense first layer, groups (2 of 4 eligible), q/k norms, q/k/v biases, partial RoPE, scaling
    "glm4_moe": ("Glm4MoeConfig", dict(
        COMMON, num_hidden_layers=3, num_key_value_heads=2, n_routed_experts=8, num_experts_per_tok=3,
        moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True)),
    "granitemoe": ("GraniteMoeConfig", dict(
        COMMON, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=2.0,
        residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=3.0)),
}
# variants that llama.cpp's GGUF holds (d_v = d_k; every Qwen3-Next layer with experts), which
# tests/test_qwen3_next.py writes as GGUF (tests/test_models.py does not run them)
VARIANTS = {
    "qwen3_next_gguf": ("Qwen3NextConfig", dict(SPECS["qwen3_next"][1], linear_value_head_dim=16, mlp_only_layers=[])),
    "qwen3_5_gguf": ("Qwen3_5TextConfig", dict(SPECS["qwen3_5"][1], linear_value_head_dim=16)),
    # "gemma4" with its KV-shared layers taking keys where llama.cpp's gemma4 gives them (the sliding one
    # the layer before the last unshared one, as in gemma-4-E2B): its layers 1 and 2 swapped
    "gemma4_gguf": ("Gemma4TextConfig", dict(SPECS["gemma4"][1], layer_types=[
        "sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"])),
}
# Gemma 4's router reports probabilities (not logits) and scales its weights per expert: tests/test_gemma4.py
MOE = [name for name in SPECS if any(family in name for family in ("moe", "mixtral", "gpt_oss", "qwen3_next"))
       and not name.startswith("gemma4")]
# one per family, each something llama.cpp's GGUF holds as is (tests/test_moe_gguf.py writes them as GGUF)
GGUF_MOE = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss", "glm4_moe", "granitemoe"]
# the dense families of 2025 likewise (tests/test_dense_gguf.py)
GGUF_DENSE = ["smollm3_every4", "olmo2", "olmo3", "granite", "exaone4"]

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")


def write_tiny_gemma4_multimodal(text: dict, directory: Path, **config_kwargs):
    """A Gemma4ForConditionalGeneration (every Gemma 4 on the hub) around the tiny text config `text`:
    a one-layer vision tower, no audio, its special ids the vocabulary's last 7; random weights as
    write_tiny's, saved to directory; returns the HF model (eval mode)."""
    import torch
    import transformers

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, patch_size=4, pooling_kernel_size=2)
    config = transformers.Gemma4Config(text_config=text, vision_config=vision, audio_config=None,
                                       image_token_id=VOCAB - 1, boi_token_id=VOCAB - 2, eoi_token_id=VOCAB - 3,
                                       video_token_id=VOCAB - 4, boa_token_id=VOCAB - 5, eoa_token_index=VOCAB - 6,
                                       audio_token_id=VOCAB - 7, **config_kwargs)
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(directory)
    return model


def write_tiny(name: str, directory: Path, seed: int = 0, vocab_size: int | None = None, **save_kwargs):
    """Build the HF model for `name` with random weights, save it, return it (eval mode)."""
    import torch
    import transformers

    cls_name, kwargs = SPECS[name] if name in SPECS else VARIANTS[name]
    if vocab_size:
        kwargs = {**kwargs, "vocab_size": vocab_size}
    config = getattr(transformers, cls_name)(**kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():  # default init is tiny; widen it so differences would show in logits
        for p in model.parameters():
            p.normal_(0, 0.2)
        for name, b in model.named_buffers():  # a router's score correction (GLM-4-MoE) is a buffer
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.2)
            if name.endswith("layer_scalar"):  # Gemma 4's scale of each layer's output (1 at init)
                b.uniform_(0.5, 1.5)
    model.eval()
    model.save_pretrained(directory, **save_kwargs)
    return model


def random_ids(n: int, seed: int = 1, batch: int = 1):
    """(batch, n) token ids below VOCAB, the same for a seed."""
    import torch

    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


def assert_hfs_logits_at_every_step_and_in_a_padded_batch(hf, ours, atol: float = 1e-4) -> None:
    """ours (a loaded nexttok model) gives hf's logits for a 20-token prompt: an 8-token prefill, then
    one cached step at a time; and in a batch of 2, the shorter prompt left-padded."""
    import torch

    from nexttok.models.cache import KVCache

    ids = random_ids(20, seed=2)
    expected = hf(ids).logits
    cache = KVCache.for_model(ours.config, max_len=24)
    torch.testing.assert_close(ours(ids[:, :8], cache), expected[:, :8], atol=atol, rtol=0)
    for t in range(8, 20):
        torch.testing.assert_close(ours(ids[:, t : t + 1], cache)[:, 0], expected[:, t], atol=atol, rtol=0)
    short, long = random_ids(9, seed=3)[0], random_ids(14, seed=4)[0]
    batch = torch.zeros(2, 14, dtype=torch.long)
    positions = torch.full((2, 14), -1)
    batch[0, 5:], positions[0, 5:] = short, torch.arange(9)  # left padding
    batch[1], positions[1] = long, torch.arange(14)
    got = ours(batch, KVCache.for_model(ours.config, batch=2, max_len=14), positions)
    torch.testing.assert_close(got[0, 5:], hf(short[None]).logits[0], atol=atol, rtol=0)
    torch.testing.assert_close(got[1], hf(long[None]).logits[0], atol=atol, rtol=0)


def write_tiny_tokenizer(directory: Path, vocab_size: int = VOCAB) -> None:
    """A byte-level BPE tokenizer.json whose ids are the first vocab_size bytes (ASCII for 128), but for
    ids 1-8 (control characters), which are eight merges of common letter pairs: enough for a tiny
    model to have a tokenizer a GGUF carries (llama.cpp wants merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from nexttok.tokenizers.tokenizer import bytes_to_unicode

    by_byte = bytes_to_unicode()
    vocab = {by_byte[b]: b for b in range(vocab_size)}
    merges = [("t", "h"), ("h", "e"), ("i", "n"), ("e", "r"), ("a", "n"), ("r", "e"), ("o", "n"), ("a", "t")]
    for i, (a, b) in enumerate(merges, start=1):
        del vocab[by_byte[i]]
        vocab[a + b] = i
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(directory / "tokenizer.json"))


def write_tiny_with_gpt2_tokenizer(name: str, directory: Path, gpt2_dir: Path, seed: int = 0):
    """A tiny model over the real GPT-2 vocab, with GPT-2's tokenizer files beside it."""
    import shutil

    model = write_tiny(name, directory, seed=seed, vocab_size=50257)
    shutil.copy(gpt2_dir / "encoder.json", directory / "vocab.json")
    shutil.copy(gpt2_dir / "vocab.bpe", directory / "merges.txt")
    return model


def write_chat_template(directory: Path, template: str = CHATML) -> None:
    import json

    (directory / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, "eos_token": "<|endoftext|>"}), encoding="utf-8")


def write_chat_model(directory: Path, gpt2_dir: Path) -> Path:
    """The servers' test model: tiny Llama, 4096-token context, GPT-2 vocab, a ChatML template."""
    write_tiny_with_gpt2_tokenizer("llama_long_context", directory, gpt2_dir)
    write_chat_template(directory)
    return directory
