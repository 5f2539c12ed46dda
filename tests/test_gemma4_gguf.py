"""Gemma 4 written as GGUF by our exporter (checkpoints/export.py) in llama.cpp's gemma4 layout
(models/gemma4_gguf.py) and read back by our loader: HF transformers' logits at every cached step and
in a padded batch for each tiny variant llama.cpp's gemma4 holds (per-layer inputs with KV-shared
layers and double-wide MLPs, keys as values on the full layers, experts beside the dense MLP, the
multimodal checkpoint's text part), the config from the file alone, the metadata keys and tensors as
llama.cpp reads them (named by the `gguf` package), Q8_0 within its 8 bits; and one-line refusals of
what llama.cpp's gemma4 would run otherwise, at export and in a file."""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest
import torch
import transformers

from nexttok.checkpoints import export
from nexttok.checkpoints.convert import convert_gguf
from nexttok.checkpoints.export import write_gguf
from nexttok.checkpoints.gguf.metadata import GGUFError, read_metadata
from nexttok.checkpoints.gguf.reader import derived_values, hf_config
from nexttok.checkpoints.loading import load_model
from nexttok.models import kernels
from nexttok.models.block_quant import BlockLinear
from nexttok.models.config import ConfigError
from nexttok.models.gemma4_gguf import gguf_metadata
from nexttok.models.registry import from_hf_config
from tiny_models import (
    VARIANTS,
    VOCAB,
    assert_hfs_logits_at_every_step_and_in_a_padded_batch,
    random_ids,
    write_tiny_gemma4_multimodal,
    write_tiny_tokenizer,
)

ATOL = 1e-4
# gemma4_gguf: "gemma4" with llama.cpp's KV sharing (tiny_models.VARIANTS); "gemma4" itself is refused
GGUF_GEMMA4 = ["gemma4_gguf", "gemma4_k_eq_v", "gemma4_moe"]


def _key(key: str) -> str:
    return key.format(arch="gemma4")


def _read(path) -> tuple[dict, dict]:
    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items()}, {t.name: t for t in reader.tensors}


@pytest.mark.parametrize("name", GGUF_GEMMA4)
@torch.inference_mode()
def test_float_gguf_gives_hfs_logits_at_every_step_and_in_a_padded_batch(written_gguf, name):
    hf, path = written_gguf(name)
    ours = load_model(path)
    assert ours.config.model_type == "gemma4_text"
    assert_hfs_logits_at_every_step_and_in_a_padded_batch(hf, ours)


@pytest.mark.parametrize("name", GGUF_GEMMA4)
def test_the_files_metadata_gives_the_checkpoints_config(written_gguf, name):
    """Every field read from config.json comes back from the metadata and rope_freqs: layer kinds,
    head sizes and KV heads per layer, the KV-shared layers and their wide MLPs, the proportional
    RoPE with its factor, keys as values, the experts."""
    _, path = written_gguf(name)
    skip = {"torch_dtype", "eos_token_id", "bos_token_id"}  # the tiny tokenizer's, not the model's
    from_file, from_checkpoint = ({k: v for k, v in dataclasses.asdict(load_model(p).config).items() if k not in skip}
                                  for p in (path, path.parent))
    assert from_file == {**from_checkpoint, "norm_eps": float(np.float32(from_checkpoint["norm_eps"]))}


def test_the_file_holds_what_llama_cpps_gemma4_reads(written_gguf):
    """gemma-4-E2B's shape: the keys llama_model_gemma4::load_arch_hparams and load_hparams read, as
    conversion/gemma.py's Gemma4Model writes them; the full layers' RoPE as rope_freqs (a quarter of
    the pairs turn, at the config's factor 2); no keys on the KV-shared layers; every tensor one of
    the `gguf` package's gemma4 names."""
    fields, tensors = _read(written_gguf("gemma4_gguf")[1])
    keys, attention, rope = gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope
    expected = {
        gguf.Keys.General.ARCHITECTURE: "gemma4", keys.BLOCK_COUNT: 5,
        attention.SLIDING_WINDOW_PATTERN: [True, True, False, True, False], attention.SLIDING_WINDOW: 5,
        attention.KEY_LENGTH: 32, attention.VALUE_LENGTH: 32, attention.KEY_LENGTH_SWA: 16,
        attention.VALUE_LENGTH_SWA: 16, rope.DIMENSION_COUNT: 32, rope.DIMENSION_COUNT_SWA: 16,
        rope.FREQ_BASE: 10000.0, rope.FREQ_BASE_SWA: 100.0, attention.HEAD_COUNT: 4, attention.HEAD_COUNT_KV: 2,
        attention.SHARED_KV_LAYERS: 2, keys.EMBD_LENGTH_PER_LAYER_INP: 8,
        keys.FEED_FORWARD_LENGTH: [96, 96, 96, 192, 192], keys.FINAL_LOGIT_SOFTCAPPING: 3.0,
    }
    assert {k: fields[_key(k)] for k in expected} == expected
    assert tensors["rope_freqs.weight"].data.tolist() == [2.0] * 4 + [float(np.float32(1e30))] * 12
    assert {"blk.2.attn_k.weight", "blk.2.attn_v.weight"} <= set(tensors)
    assert not {f"blk.{i}.attn_{p}.weight" for i in (3, 4) for p in ("k", "v", "k_norm")} & set(tensors)
    assert list(tensors["per_layer_token_embd.weight"].shape) == [5 * 8, VOCAB]  # llama.cpp's {layers·size, vocab}
    assert list(tensors["blk.4.ffn_up.weight"].shape) == [64, 192]  # the wide MLP of a KV-shared layer
    table = [gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GEMMA4]]
    names = {f"{n.format(bid=i)}.{suffix}" for n in table for i in range(5) for suffix in ("weight", "scale")}
    assert set(tensors) <= names and "output.weight" not in tensors  # tied


def test_keys_as_values_and_experts_as_llama_cpp_reads_them(written_gguf):
    """gemma-4-31B's full layers: one KV head, attn_k and no attn_v (llama.cpp then takes the keys as
    values); gemma-4-26B-A4B's experts: gate and up in one ffn_gate_up_exps, the router's scale and
    the per-expert scale as llama.cpp's .scale tensors."""
    fields, tensors = _read(written_gguf("gemma4_k_eq_v")[1])
    assert fields[_key(gguf.Keys.Attention.HEAD_COUNT_KV)] == [2, 1, 1]
    assert fields[_key(gguf.Keys.LLM.FINAL_LOGIT_SOFTCAPPING)] == 0.0  # no cap (absent, llama.cpp caps at 30)
    assert "blk.0.attn_v.weight" in tensors and "blk.1.attn_v.weight" not in tensors
    assert "blk.2.attn_v.weight" not in tensors and "output.weight" in tensors  # untied
    fields, tensors = _read(written_gguf("gemma4_moe")[1])
    experts = {gguf.Keys.LLM.EXPERT_COUNT: 4, gguf.Keys.LLM.EXPERT_USED_COUNT: 2,
               gguf.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: 32}
    assert {k: fields[_key(k)] for k in experts} == experts
    shapes = {n: list(t.shape) for n, t in tensors.items() if n.startswith("blk.1.")}  # ggml's order, as llama.cpp
    assert shapes["blk.1.ffn_gate_up_exps.weight"] == [64, 64, 4] and shapes["blk.1.ffn_down_exps.weight"] == [32, 64, 4]
    assert shapes["blk.1.ffn_gate_inp.weight"] == [64, 4] and shapes["blk.1.ffn_gate_inp.scale"] == [64]
    assert shapes["blk.1.ffn_down_exps.scale"] == [4] and shapes["blk.1.layer_output_scale.weight"] == [1]
    assert "blk.1.ffn_gate_exps.weight" not in shapes  # as the converter writes HF's fused gate_up_proj


@pytest.mark.parametrize("name", ["gemma4_gguf", "gemma4_moe"])
@torch.inference_mode()
def test_q8_0_gguf_agrees_with_hf_within_its_8_bits(written_gguf, name):
    hf, path = written_gguf(name, "Q8_0")
    ours = load_model(path)
    if kernels.available():  # the projections stay Q8_0 (the experts' GELU has no kernel: they are dequantized)
        assert any(isinstance(m, BlockLinear) for m in ours.modules())
    ids = random_ids(16, seed=5)
    got, expected = ours(ids), hf(ids).logits
    assert (got - expected).abs().mean() <= 0.015 * expected.abs().max()


@pytest.mark.parametrize("name", GGUF_GEMMA4)
@torch.inference_mode()
def test_the_file_converted_to_hfs_layout_runs_in_transformers(written_gguf, tmp_path, name):
    """convert_gguf writes the config gguf_config reads (per_layer_config, rope_parameters) and the
    tensors under HF's names: transformers itself loads it and gives the checkpoint's logits."""
    hf, path = written_gguf(name)
    converted = transformers.AutoModelForCausalLM.from_pretrained(convert_gguf(path, tmp_path / "hf")).eval()
    ids = random_ids(12, seed=6)
    torch.testing.assert_close(converted(ids).logits, hf(ids).logits, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_multimodal_checkpoints_text_part_is_written_as_gemma4(tmp_path):
    """Gemma4ForConditionalGeneration (every Gemma 4 on the hub; here gemma-4-E2B's text shape): its
    text model is written, the vision tower left out; the file reads back as the text model with
    HF's logits."""
    hf = write_tiny_gemma4_multimodal(VARIANTS["gemma4_gguf"][1], tmp_path)
    write_tiny_tokenizer(tmp_path)
    ours = load_model(write_gguf(tmp_path, tmp_path / "x-F32.gguf"))
    assert ours.config.model_type == "gemma4_text"
    ids = random_ids(14, seed=4, batch=2) % (VOCAB - 8)  # no image / audio placeholders: text only
    torch.testing.assert_close(ours(ids), hf(input_ids=ids).logits, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_keys_of_kv_shared_layers_in_the_file_are_left_unread(written_gguf, tmp_path, monkeypatch):
    """A checkpoint saved before transformers dropped them holds k_proj / k_norm on KV-shared layers,
    and the converter writes them; llama.cpp loads them as optional and never uses them: so do we."""
    hf, path = written_gguf("gemma4_gguf")
    plain = export.gguf_tensors

    def with_unused_keys(model, layout):
        yield from plain(model, layout)
        yield "blk.3.attn_k.weight", np.ones((32, 64), np.float32)
        yield "blk.3.attn_k_norm.weight", np.ones(16, np.float32)

    monkeypatch.setattr(export, "gguf_tensors", with_unused_keys)
    ours = load_model(write_gguf(path.parent, tmp_path / "x-F32.gguf"))
    ids = random_ids(12, seed=7)
    torch.testing.assert_close(ours(ids), hf(ids).logits, atol=ATOL, rtol=0)


def test_kv_sharing_llama_cpp_does_otherwise_is_refused_at_export(written_gguf):
    """tiny "gemma4": its sliding KV-shared layer takes layer 2's keys, its full one layer 1's;
    llama.cpp's gemma4 would give them layer 1's and 2's, of the other kind (written anyway, the
    file aborts llama.cpp: GGML_ASSERT in llama-kv-cache.cpp, the reused layer is not in its cache)."""
    with pytest.raises(GGUFError, match=r"llama.cpp's GGUF cannot hold KV-shared layers taking keys from other "
                                        r"layers than llama.cpp's gemma4 gives them .*\[1, 2\], this checkpoint "
                                        r"\[2, 1\]\)") as e:
        written_gguf("gemma4")
    assert "\n" not in str(e.value)


BASE = {"model_type": "gemma4_text", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 96, "head_dim": 16, "num_key_value_heads": 2,
        "hidden_size_per_layer_input": 0}


@pytest.mark.parametrize(("changes", "message"), [
    ({"attention_bias": True}, "attention biases"),
    ({"hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 64},
     "a per-layer input table of 64 rows for a vocabulary of 128"),
    ({"num_kv_shared_layers": 1, "layer_types": ["full_attention", "full_attention"]},
     "fewer than 2 layers that compute keys"),
])
def test_what_llama_cpps_gemma4_cannot_hold_is_refused_in_one_line(changes, message):
    with pytest.raises(ConfigError, match=f"^llama.cpp's GGUF cannot hold {message}") as e:
        gguf_metadata(from_hf_config({**BASE, **changes}))
    assert "\n" not in str(e.value)


def _file(written_gguf, name: str = "gemma4_gguf") -> tuple[dict, set[str], dict]:
    """(metadata, tensor names, derived values) of an exported tiny variant, to alter."""
    path = written_gguf(name)[1]
    meta, entries = read_metadata(path)
    return meta, {e.name for e in entries}, derived_values(path, meta, entries)


def test_where_the_file_is_silent_llama_cpps_defaults_are_read(written_gguf):
    """No final_logit_softcapping: llama.cpp caps at 30 (its hparams' default; our export writes 0 for
    none); no freq_base_swa: theta 10000 on the sliding layers; no shared_kv_layers: none shared."""
    meta, names, vectors = _file(written_gguf, "gemma4_k_eq_v")
    silent = {k: v for k, v in meta.items() if k not in {
        "gemma4.final_logit_softcapping", "gemma4.rope.freq_base_swa", "gemma4.attention.shared_kv_layers"}}
    config = from_hf_config(hf_config(silent, names, vectors))
    assert (config.final_logit_softcapping, config.rope_local_base_freq, config.num_kv_shared_layers) == (30.0, 1e4, 0)
    assert from_hf_config(hf_config(meta, names, vectors)).final_logit_softcapping is None


@pytest.mark.parametrize(("key", "value", "message"), [
    ("attention.sliding_window_pattern", 5, "sliding_window_pattern must be a bool per layer"),
    ("attention.sliding_window_pattern", [True] * 5, "a last layer that slides is not supported"),
    ("feed_forward_length", [96, 192, 96, 192, 192], r"feed_forward_length \[96, 192, 96, 192, 192\]: one width"),
    ("rope.dimension_count_swa", 8, "rope.dimension_count_swa 8 is not the layers' head size 16"),
    ("rope.scaling.type", "yarn", "rope scaling 'yarn' is not supported for gemma4"),
    ("rope_freqs.weight", [2.0, 1.0, 2.0, 2.0] + [1e30] * 12, "rope_freqs.weight other than one factor"),
    ("rope_freqs.weight", [1.0] * 4, r"the full layers' RoPE, 16 factors\) is missing or of another size"),
    ("blk.0.attn_v.weight", None, r"layers \[0\] have no attn_v"),
])
def test_a_file_llama_cpp_runs_otherwise_is_one_line_naming_it(written_gguf, key, value, message):
    """Keys and tensors llama.cpp's gemma4 reads otherwise than a Gemma 4 runs (or not at all): the
    loader names what it cannot express instead of running something else."""
    meta, names, vectors = _file(written_gguf)
    if key in vectors:
        vectors[key] = tuple(value)
    elif key in names:
        names.discard(key)
    else:
        meta = {**meta, f"gemma4.{key}": value}
    with pytest.raises(GGUFError, match=message) as e:
        hf_config(meta, names, vectors)
    assert "\n" not in str(e.value)
