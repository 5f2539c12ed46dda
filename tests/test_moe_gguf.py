"""Every mixture-of-experts family written as a GGUF by our exporter (checkpoints/export.py: llama.cpp's
tensor names and metadata, types the gguf package writes) and read back by our GGUF loader: float32
files give HF transformers' logits at every cached step and in a padded batch; Q8_0 files run their
experts on the block kernels (BlockExperts), hold about the file's bytes, and agree with the same
file dequantized; what llama.cpp's format cannot hold is refused in one line."""

from __future__ import annotations

import pytest
import torch
from gguf import GGUFReader

from nexttok.checkpoints.export import write_gguf
from nexttok.checkpoints.gguf.metadata import GGUFError
from nexttok.checkpoints.loading import load_checkpoint, load_model
from nexttok.checkpoints.weights import weight_bytes
from nexttok.models import kernels
from nexttok.models.block_quant import BlockExperts
from nexttok.models.moe import Experts
from tiny_models import (
    GGUF_MOE,
    assert_hfs_logits_at_every_step_and_in_a_padded_batch,
    random_ids,
    write_tiny,
    write_tiny_tokenizer,
)

ATOL = 1e-4
ARCHS = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama", "olmoe": "olmoe",
         "gpt_oss": "gpt-oss", "glm4_moe": "glm4moe", "granitemoe": "granitemoe"}


@pytest.mark.parametrize("name", GGUF_MOE)
@torch.inference_mode()
def test_float_gguf_gives_hfs_logits_at_every_step_and_in_a_padded_batch(written_gguf, name):
    hf, path = written_gguf(name)
    assert GGUFReader(str(path)).fields["general.architecture"].contents() == ARCHS[name]
    ours = load_model(path)
    assert ours.config.model_type == name
    assert_hfs_logits_at_every_step_and_in_a_padded_batch(hf, ours, ATOL)


@pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: the kernels are not built")
@pytest.mark.parametrize("name", GGUF_MOE)
@torch.inference_mode()
def test_q8_0_gguf_runs_its_experts_in_blocks(written_gguf, name):
    """As shipped, the experts stay Q8_0 (BlockExperts, the file's bytes); the model agrees with the
    same file dequantized (float experts) up to the kernels' 8-bit activations, and with HF up to
    the file's 8-bit weights. The bounds are on the mean and on the distributions' KL divergence (a
    near tie between two experts' scores may go the other way at a position; and these random
    models' distributions are near uniform, so which token is top is a coin toss). Measured: mean
    error 0.2-0.8% of the largest logit, KL 1e-6..3e-4 nats."""
    hf, path = written_gguf(name, "Q8_0")
    shipped, dequantized = load_model(path), load_model(path, dtype="float32")
    experts = [m for m in shipped.modules() if isinstance(m, BlockExperts)]
    assert len(experts) == shipped.config.mlp_types.count("sparse") and experts[0].gate_up.kinds == ["Q8_0", "Q8_0"]
    assert not any(isinstance(m, Experts) for m in shipped.modules())
    assert weight_bytes(shipped) <= 1.1 * path.stat().st_size
    ids = random_ids(16, seed=5)
    got, ref, expected = shipped(ids), dequantized(ids), hf(ids).logits
    scale = expected.abs().max()
    for other in (ref, expected):
        assert (got - other).abs().mean() <= 0.015 * scale
        kl = torch.nn.functional.kl_div(got.log_softmax(-1), other.log_softmax(-1), log_target=True, reduction="none")
        assert kl.sum(-1).mean() <= 1e-3


@torch.inference_mode()
def test_a_checkpoint_round_trips_through_gguf_and_back(written_gguf, tmp_path):
    """load_checkpoint on the GGUF: tokenizer and config from the file's metadata, as the directory's."""
    _, path = written_gguf("glm4_moe")
    checkpoint = load_checkpoint(path)
    assert checkpoint.tokenizer.encode("Hi!") == [ord("H"), ord("i"), ord("!")]
    config = checkpoint.model.config
    assert (config.router, config.n_group, config.topk_group, config.mlp_types[0]) == ("sigmoid", 4, 2, "dense")
    assert config.routed_scaling_factor == 2.5 and config.norm_topk_prob and config.partial_rotary_factor == 0.5


@pytest.mark.parametrize(("name", "changes", "message"), [
    ("qwen3_moe_unnormed", {}, "llama.cpp's GGUF cannot hold norm_topk_prob False"),
    ("gpt_oss_untruncated", {}, None),  # written (llama.cpp rounds YaRN's range, as its converter does)
])
def test_what_gguf_cannot_hold_is_refused_in_one_line(tmp_path, name, changes, message):
    write_tiny(name, tmp_path)
    write_tiny_tokenizer(tmp_path)
    if message is None:
        write_gguf(tmp_path, tmp_path / "m.gguf")
        return
    with pytest.raises(GGUFError, match=message) as error:
        write_gguf(tmp_path, tmp_path / "m.gguf")
    assert "\n" not in str(error.value)


HARMONY = ["<|endoftext|>", "<|return|>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>"]


def test_gpt_oss_gguf_stops_where_llama_cpp_does(tmp_path):
    """A GGUF holds one eos id (<|return|>); the harmony template's other end tokens (<|call|>,
    <|endoftext|>) stop generation too, and <|end|>, which closes the analysis channel, does not."""
    import json
    from pathlib import Path

    write_tiny("gpt_oss", tmp_path)
    write_tiny_tokenizer(tmp_path)
    tokenizer = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    ids = {text: 14 + i for i, text in enumerate(HARMONY)}  # over control characters 14..20
    for text, i in ids.items():
        del vocab[next(t for t, j in vocab.items() if j == i)]
        vocab[text] = i
    tokenizer["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                                  "normalized": False, "special": True} for t, i in ids.items()]
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    template = (Path(__file__).parent / "templates" / "openai-gpt-oss-120b.jinja").read_text()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|return|>"}))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "eos_token_id": ids["<|return|>"]}))
    checkpoint = load_checkpoint(write_gguf(tmp_path, tmp_path / "m.gguf"))
    stops = checkpoint.model.config.eos_token_id
    assert {ids[t] for t in ("<|return|>", "<|call|>", "<|endoftext|>")} <= set(stops)
    assert ids["<|end|>"] not in stops
    rendered = checkpoint.chat_template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert rendered.endswith("<|start|>assistant")


@pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: the kernels are not built")
@torch.inference_mode()
def test_mxfp4_experts_as_gpt_oss_ships_them(written_gguf):
    """gpt-oss ships its experts in MXFP4: written so (the gguf package's quantizer), they run on the
    block kernels and agree with the same file dequantized and with HF (a 4-bit format: looser)."""
    hf, path = written_gguf("gpt_oss", "MXFP4")
    shipped, dequantized = load_model(path), load_model(path, dtype="float32")
    experts = [m for m in shipped.modules() if isinstance(m, BlockExperts)]
    assert experts and experts[0].gate_up.kinds == ["MXFP4", "MXFP4"] and experts[0].down.kinds == ["MXFP4"]
    assert weight_bytes(shipped) <= 1.1 * path.stat().st_size
    ids = random_ids(16, seed=6)
    got, ref, expected = shipped(ids), dequantized(ids), hf(ids).logits
    kl = torch.nn.functional.kl_div
    assert kl(got.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="none").sum(-1).mean() <= 1e-3
    assert kl(got.log_softmax(-1), expected.log_softmax(-1), log_target=True, reduction="none").sum(-1).mean() <= 1e-2


def test_a_block_type_nothing_runs_is_one_line_naming_it_and_the_tensor(tmp_path, monkeypatch, capsys):
    """A tensor in a type neither the kernels nor the gguf package can read (Q8_1 here) fails the
    load in one line naming the tensor and the type, from the library and from the CLI."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    from nexttok.checkpoints import export
    from nexttok.cli import main

    write_tiny("qwen3_moe", tmp_path)
    write_tiny_tokenizer(tmp_path)
    plain = export._write_tensor

    def odd_one(writer, name, array, kind):
        if name != "blk.1.attn_q.weight":
            return plain(writer, name, array, kind)
        size = quants.GGML_QUANT_SIZES[GGMLQuantizationType.Q8_1][1]
        raw = np.zeros((array.shape[0], array.shape[1] // 32 * size), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType.Q8_1)

    monkeypatch.setattr(export, "_write_tensor", odd_one)
    path = write_gguf(tmp_path, tmp_path / "odd.gguf", "Q8_0")
    with pytest.raises(GGUFError, match=r"GGUF tensor 'model.layers.1.self_attn.q_proj.weight' \(Q8_1\)") as error:
        load_model(path)
    assert "\n" not in str(error.value)
    capsys.readouterr()  # what writing the checkpoint printed
    assert main(["run", str(path), "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Q8_1" in err and "Traceback" not in err
