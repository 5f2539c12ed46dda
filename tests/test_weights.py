"""Checkpoint loading: sharded files, old GPT-2 names, and a clear error for every bad file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from nexttok.checkpoints.loading import load_model
from nexttok.checkpoints.weights import pick_dtype
from nexttok.models.config import CheckpointError, ConfigError
from tiny_models import VOCAB, write_tiny


@pytest.fixture
def llama_dir(tmp_path):
    write_tiny("llama_gqa_llama3_rope", tmp_path)
    return tmp_path


def _ids():
    return torch.arange(10)[None] % VOCAB


def _rewrite(directory, change):
    path = directory / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


@torch.inference_mode()
def test_sharded_checkpoint_loads(tmp_path):
    hf = write_tiny("qwen2", tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    torch.testing.assert_close(load_model(tmp_path)(_ids()), hf(_ids()).logits, atol=1e-4, rtol=0)


def test_missing_shard_and_malformed_index(tmp_path):
    write_tiny("qwen2", tmp_path, max_shard_size="100KB")
    index = tmp_path / "model.safetensors.index.json"
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"shards listed in .* are missing: {shard.name}"):
        load_model(tmp_path)
    index.write_text("{}")
    with pytest.raises(CheckpointError, match="model.safetensors.index.json is malformed"):
        load_model(tmp_path)


@torch.inference_mode()
def test_old_gpt2_names_without_prefix(tmp_path):
    hf = write_tiny("gpt2", tmp_path)
    _rewrite(tmp_path, lambda t: t.update({k.removeprefix("transformer."): t.pop(k) for k in list(t)}))
    assert not any(k.startswith("transformer.") for k in load_file(tmp_path / "model.safetensors"))
    torch.testing.assert_close(load_model(tmp_path)(_ids()), hf(_ids()).logits, atol=1e-4, rtol=0)


def test_truncated_file_names_the_tensor(llama_dir):
    path = llama_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="tensor 'model.layers.1.self_attn.v_proj.weight' needs bytes .* \\(truncated"):
        load_model(llama_dir)


def test_zero_length_file(llama_dir):
    (llama_dir / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="0 bytes: too short for a safetensors header"):
        load_model(llama_dir)


def test_oversized_header(llama_dir):
    (llama_dir / "model.safetensors").write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(CheckpointError, match="header claims 1000000000000 bytes"):
        load_model(llama_dir)


def test_header_not_json(llama_dir):
    (llama_dir / "model.safetensors").write_bytes((4).to_bytes(8, "little") + b"{{{{")
    with pytest.raises(CheckpointError, match="header is not valid JSON"):
        load_model(llama_dir)


@pytest.mark.parametrize("change,message", [
    (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "tensor 'model.layers.1.mlp.up_proj.weight' is missing"),
    (lambda t: t.update({"model.norm.weight": torch.ones(63)}),
     "tensor 'model.norm.weight' has shape \\(63,\\), expected \\(64,\\)"),
    (lambda t: t.update({"model.norm.weight": torch.ones(64, dtype=torch.int32)}),
     "tensor 'model.norm.weight' has dtype torch.int32"),
    (lambda t: t.update({"model.layers.9.extra.weight": torch.ones(2)}),
     "1 tensors this architecture does not use: model.layers.9.extra"),
], ids=["missing", "shape", "dtype", "unexpected"])
def test_bad_tensor_is_named(llama_dir, change, message):
    _rewrite(llama_dir, change)
    with pytest.raises(CheckpointError, match=message):
        load_model(llama_dir)


def test_config_mismatch_is_a_shape_error(llama_dir):
    config = json.loads((llama_dir / "config.json").read_text())
    config["intermediate_size"] = 80
    (llama_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="gate_proj.weight' has shape \\(96, 64\\), expected \\(80, 64\\)"):
        load_model(llama_dir)


def test_pickles_are_refused(tmp_path):
    write_tiny("gpt2", tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"not even read")
    with pytest.raises(CheckpointError, match="only pickle weights \\(pytorch_model.bin\\). nexttok never unpickles"):
        load_model(tmp_path)
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors weights"):
        load_model(tmp_path)


def test_config_problems(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json in"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(ConfigError, match="config.json is not valid JSON"):
        load_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such checkpoint directory: ./missing"):
        load_model("./missing")


def test_bad_dtype_and_device(llama_dir):
    with pytest.raises(ValueError, match="dtype must be one of auto, int8, int4, float32, .*got 'float8'"):
        load_model(llama_dir, dtype="float8")
    with pytest.raises(ValueError, match="device 'gpu7' is not valid"):
        load_model(llama_dir, device="gpu7")


def test_default_dtype_is_float32_on_cpu(llama_dir):
    model = load_model(llama_dir)
    assert model.embed_tokens.weight.dtype == torch.float32
    assert pick_dtype(None, torch.device("cpu"), model.config) == torch.float32


def test_hub_id_offline_and_not_cached(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    code = "from nexttok.checkpoints.loading import load_model; load_model('HuggingFaceTB/SmolLM2-135M')"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "is not a local path, not in the Hugging Face cache, and could not be downloaded" in result.stderr
