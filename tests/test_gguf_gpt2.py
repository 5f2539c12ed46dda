"""GPT-2 from GGUF: a tiny random HF GPT-2 (save_pretrained) written as llama.cpp's convert_hf_to_gguf
writes one (F32; tensor names from the `gguf` package's own GPT-2 table, Conv1D weights transposed,
attn.bias buffers dropped) loads and gives HF's logits, full prompt and every cached step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from nexttok.checkpoints.gguf.reader import GGUFError, hf_tensor_name, read_gguf
from nexttok.checkpoints.loading import load_checkpoint
from nexttok.models.cache import KVCache
from nexttok.tokenizers.tokenizer import bytes_to_unicode
from tiny_models import SPECS, VOCAB, write_tiny

ATOL = 1e-4


def write_gpt2_gguf(directory: Path, out: Path, with_output: bool) -> Path:
    """convert_hf_to_gguf's GPT2Model, done with the gguf package: metadata, the transposed
    Conv1D weights, names by gguf's TensorNameMap. with_output: also an output.weight (a copy of
    token_embd, as older converters wrote), which newer ones leave out."""
    import gguf
    from safetensors.numpy import load_file

    hp = SPECS["gpt2"][1]
    writer = gguf.GGUFWriter(str(out), "gpt2")
    writer.add_block_count(hp["n_layer"])
    writer.add_context_length(hp["n_positions"])
    writer.add_embedding_length(hp["n_embd"])
    writer.add_feed_forward_length(4 * hp["n_embd"])
    writer.add_head_count(hp["n_head"])
    writer.add_layer_norm_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = list(bytes_to_unicode().values())[:VOCAB]  # a byte-level vocabulary of VOCAB tokens
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * VOCAB)
    writer.add_token_merges([])
    writer.add_bos_token_id(hp["bos_token_id"])
    writer.add_eos_token_id(hp["eos_token_id"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, hp["n_layer"])
    for name, array in load_file(str(directory / "model.safetensors")).items():
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        if name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            array = array.T
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert target is not None, name
        writer.add_tensor(target, np.ascontiguousarray(array, dtype=np.float32))
        if with_output and target == "token_embd.weight":
            writer.add_tensor("output.weight", np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.fixture(scope="module", params=[False, True], ids=["tied", "with_output"])
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2")
    hf = write_tiny("gpt2", directory)
    path = write_gpt2_gguf(directory, directory / "tiny-gpt2-f32.gguf", request.param)
    return hf, load_checkpoint(path)


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def test_config_and_names(pair):
    _, checkpoint = pair
    config = checkpoint.model.config
    assert (config.model_type, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.intermediate_size, config.max_position_embeddings, config.vocab_size) == (
        "gpt2", 64, 2, 4, 256, 128, VOCAB)
    assert hf_tensor_name("blk.1.attn_qkv.weight", "gpt2") == "transformer.h.1.attn.c_attn.weight"
    assert hf_tensor_name("position_embd.weight", "gpt2") == "transformer.wpe.weight"
    with pytest.raises(GGUFError, match="'blk.0.attn_q.weight' has no HF equivalent"):
        hf_tensor_name("blk.0.attn_q.weight", "gpt2")


@torch.inference_mode()
def test_full_prompt_logits_match_hf(pair):
    hf, checkpoint = pair
    ids = _ids(24, seed=1)
    torch.testing.assert_close(checkpoint.model(ids), hf(ids).logits, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_every_cached_decode_step_matches_hf(pair):
    hf, checkpoint = pair
    ours = checkpoint.model
    ids = _ids(40, seed=2)
    expected = hf(ids).logits  # (1, 40, V)
    cache = KVCache.for_model(ours.config, max_len=48)
    torch.testing.assert_close(ours(ids[:, :10], cache), expected[:, :10], atol=ATOL, rtol=0)
    for t in range(10, 40):
        step = ours(ids[:, t : t + 1], cache)
        torch.testing.assert_close(step[:, 0], expected[:, t], atol=ATOL, rtol=0)
    assert cache.offset == 40


def test_tokenizer_comes_from_the_file(pair):
    _, checkpoint = pair
    tokenizer = checkpoint.tokenizer
    assert tokenizer.vocab_size == VOCAB
    assert tokenizer.decode(tokenizer.encode("abc")) == "abc"


def test_tensor_layout_errors_name_the_tensor(tmp_path):
    hf_dir = tmp_path / "hf"
    write_tiny("gpt2", hf_dir)
    path = write_gpt2_gguf(hf_dir, tmp_path / "m.gguf", with_output=False)
    gguf = read_gguf(path)
    assert gguf.config["model_type"] == "gpt2" and gguf.config["tie_word_embeddings"] is True
    shapes = {t.name: t.shape for t in gguf.blocks()}
    assert shapes["transformer.h.0.attn.c_attn.weight"] == (192, 64)  # (out, in): nn.Linear's layout
    assert shapes["transformer.h.0.mlp.c_fc.weight"] == (256, 64)
