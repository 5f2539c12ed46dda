"""The dense families of 2025 (SmolLM3, OLMo 2, OLMo 3, Granite, EXAONE 4) written as GGUF by our
exporter (checkpoints/export.py) in llama.cpp's names and metadata, as its convert_hf_to_gguf.py
writes them, and read back by our GGUF loader: HF transformers' logits at every cached step and in
a padded batch, each family's config from the metadata alone; what llama.cpp's format cannot hold
is refused in one line, and so is a file the loader cannot express."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGUFReader

from nexttok.checkpoints import export
from nexttok.checkpoints.export import write_gguf
from nexttok.checkpoints.gguf.metadata import GGUFError
from nexttok.checkpoints.loading import load_model
from nexttok.models import kernels
from nexttok.models.architecture import GGUFMeta
from nexttok.models.block_quant import BlockLinear
from tiny_models import (
    GGUF_DENSE,
    assert_hfs_logits_at_every_step_and_in_a_padded_batch,
    random_ids,
    write_tiny,
    write_tiny_tokenizer,
)

ARCHS = {"smollm3_every4": ("smollm3", "smollm3"), "olmo2": ("olmo2", "olmo2"), "olmo3": ("olmo2", "olmo3"),
         "granite": ("granite", "granite"), "exaone4": ("exaone4", "exaone4")}  # name: (GGUF arch, model_type)


@pytest.mark.parametrize("name", GGUF_DENSE)
@torch.inference_mode()
def test_float_gguf_gives_hfs_logits_at_every_step_and_in_a_padded_batch(written_gguf, name):
    hf, path = written_gguf(name)
    arch, model_type = ARCHS[name]
    assert GGUFReader(str(path)).fields["general.architecture"].contents() == arch
    ours = load_model(path)
    assert ours.config.model_type == model_type
    assert_hfs_logits_at_every_step_and_in_a_padded_batch(hf, ours)


@pytest.mark.parametrize("name", GGUF_DENSE)
def test_the_files_metadata_gives_the_checkpoints_config(written_gguf, name):
    """Every field the family reads from config.json comes back from the GGUF's metadata (the NoPE
    layers, OLMo 3's layer kinds and their two RoPEs, Granite's multipliers, EXAONE 4's pattern)."""
    _, path = written_gguf(name)
    skip = {"torch_dtype", "eos_token_id", "bos_token_id"}  # the tiny tokenizer's, not the model's
    from_file, from_checkpoint = ({k: _float32(v) for k, v in dataclasses.asdict(load_model(p).config).items()
                                   if k not in skip} for p in (path, path.parent))
    assert from_file == from_checkpoint


def _float32(value):
    """value with its floats as float32 holds them (GGUF's metadata floats): 1e-06 -> 9.99999997e-07."""
    if isinstance(value, float):
        return float(np.float32(value))
    if isinstance(value, dict):
        return {k: _float32(v) for k, v in value.items()}
    return [_float32(v) for v in value] if isinstance(value, list) else value


def test_what_each_family_keeps_in_the_metadata(written_gguf):
    """The keys llama.cpp reads, as its converter writes them (tests/tiny_models.py's values)."""
    fields = {name: GGUFReader(str(written_gguf(name)[1])).fields for name in ("olmo3", "granite", "exaone4")}
    olmo3, granite, exaone4 = (fields[n] for n in ("olmo3", "granite", "exaone4"))
    assert olmo3["olmo2.attention.sliding_window"].contents() == 5
    assert olmo3["olmo2.attention.sliding_window_pattern"].contents() == [True, False, True]
    assert olmo3["olmo2.rope.freq_base_swa"].contents() == 500.0
    assert olmo3["olmo2.rope.freq_base"].contents() == 10000.0
    assert olmo3["olmo2.rope.scaling.type"].contents() == "yarn"
    assert olmo3["olmo2.rope.scaling.original_context_length"].contents() == 32
    assert {k: round(granite[f"granite.{k}"].contents(), 4) for k in (
        "embedding_scale", "residual_scale", "attention.scale", "logit_scale")} == {
        "embedding_scale": 3.0, "residual_scale": 0.4, "attention.scale": 0.15, "logit_scale": 2.5}
    assert exaone4["exaone4.attention.sliding_window"].contents() == 5
    assert exaone4["exaone4.attention.sliding_window_pattern"].contents() == [True, True, False]


@pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: the kernels are not built")
@pytest.mark.parametrize("name", GGUF_DENSE)
@torch.inference_mode()
def test_q8_0_gguf_runs_on_the_block_kernels(written_gguf, name):
    """As shipped, the projections stay Q8_0 (BlockLinear over the file's bytes; Llama-style q/k rows
    un-permuted whole), and the model agrees with the same file dequantized and with HF up to 8-bit
    weights and activations (bounds as tests/test_moe_gguf.py's)."""
    hf, path = written_gguf(name, "Q8_0")
    shipped, dequantized = load_model(path), load_model(path, dtype="float32")
    assert any(isinstance(m, BlockLinear) for m in shipped.modules())
    ids = random_ids(16, seed=5)
    got, ref, expected = shipped(ids), dequantized(ids), hf(ids).logits
    for other in (ref, expected):
        assert (got - other).abs().mean() <= 0.015 * expected.abs().max()
        kl = torch.nn.functional.kl_div(got.log_softmax(-1), other.log_softmax(-1), log_target=True, reduction="none")
        assert kl.sum(-1).mean() <= 1e-3


@pytest.mark.parametrize("name", ["smollm3", "smollm3_sliding"])
def test_what_llama_cpps_format_cannot_hold_is_refused_in_one_line(tmp_path, name):
    """llama.cpp's smollm3 takes no NoPE pattern from the file (every 4th layer, its constant), nor a
    window: a SmolLM3 with NoPE on every 2nd or 3rd layer is refused, not written to run otherwise."""
    write_tiny(name, tmp_path)
    write_tiny_tokenizer(tmp_path)
    with pytest.raises(GGUFError, match="llama.cpp's GGUF cannot hold no_rope_layers other than every 4th") as e:
        write_gguf(tmp_path, tmp_path / "m.gguf")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("name", "key", "value", "message"), [
    ("olmo3", "olmo2.attention.sliding_window_pattern", [True, False],
     "olmo2.attention.sliding_window_pattern has 2 entries for 3 layers"),
    ("exaone4", "exaone4.rope.freq_base", 20000.0,
     "exaone4.rope.freq_base_swa other than rope.freq_base is not supported"),
])
def test_a_file_the_loader_cannot_express_is_one_line_naming_the_key(tmp_path, monkeypatch, name, key, value,
                                                                     message):
    """A pattern of the wrong length; an EXAONE 4 whose sliding layers would turn at a theta of their
    own (freq_base changed under the freq_base_swa written beside it)."""
    write_tiny(name, tmp_path)
    write_tiny_tokenizer(tmp_path)
    plain = export._add

    def altered(writer, k, v):
        if k == "exaone4.rope.freq_base":
            plain(writer, "exaone4.rope.freq_base_swa", v)
        plain(writer, k, value if k == key else v)

    monkeypatch.setattr(export, "_add", altered)
    path = write_gguf(tmp_path, tmp_path / "m.gguf")
    with pytest.raises(GGUFError, match=message) as e:
        load_model(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("pattern", "expected"), [
    (None, "SSSFSSSF"),  # llama.cpp's default for olmo2 and exaone4: the last of every 4 global
    (3, "SSFSSFSS"),
    (0, "SSSSSSSS"),
    ([False, True] * 4, "FSFSFSFS"),
])
def test_sliding_window_pattern_as_llama_cpp_reads_it(pattern, expected):
    values = {"general.architecture": "olmo2"}
    if pattern is not None:
        values["olmo2.attention.sliding_window_pattern"] = pattern
    types = GGUFMeta(values, frozenset(), []).layer_types(8, 4)
    assert "".join("S" if t == "sliding_attention" else "F" for t in types) == expected


@pytest.mark.parametrize("name", ["llama_linear_rope_tied_bias", "qwen2"])
@torch.inference_mode()
def test_biases_come_back_from_the_tensors_the_file_holds(written_gguf, name):
    """No metadata key says a Llama has attention / MLP biases: the loader reads them from the
    tensors there (as llama.cpp does), so our own export of one loads and gives HF's logits."""
    hf, path = written_gguf(name)
    ours = load_model(path)
    assert ours.config.attention_bias
    assert_hfs_logits_at_every_step_and_in_a_padded_batch(hf, ours)


@pytest.mark.parametrize("name", ["qwen2_sliding", "qwen3_sliding_bias_tied"])
def test_sliding_layers_llama_cpps_format_cannot_hold_are_refused_at_export(written_gguf, name):
    with pytest.raises(GGUFError, match=r"llama.cpp's qwen[23] GGUF has no sliding-window layers, and this "
                                        r"checkpoint has some \(use_sliding_window\)"):
        written_gguf(name)
