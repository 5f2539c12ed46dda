"""Tiny random HF checkpoints written with save_pretrained: the oracle for the model tests."""

from __future__ import annotations

from pathlib import Path

VOCAB = 128

COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=96, max_position_embeddings=256)

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
}

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")


def write_tiny(name: str, directory: Path, seed: int = 0, vocab_size: int | None = None, **save_kwargs):
    """Build the HF model for `name` with random weights, save it, return it (eval mode)."""
    import torch
    import transformers

    cls_name, kwargs = SPECS[name]
    if vocab_size:
        kwargs = {**kwargs, "vocab_size": vocab_size}
    config = getattr(transformers, cls_name)(**kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():  # default init is tiny; widen it so differences would show in logits
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.eval()
    model.save_pretrained(directory, **save_kwargs)
    return model


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
