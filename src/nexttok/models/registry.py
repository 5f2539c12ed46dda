"""The architectures nexttok runs: one entry each, all that is known of a family in one place.

    Architecture(model_type, model, fields, gguf, renames)
        model_type  HF config.json's model_type
        model       the nn.Module class (a file of its own, models/<family>.py)
        fields      config.json -> ModelConfig's fields (what the family reads, its defaults)
        gguf        how llama.cpp writes it (GGUFLayout: general.architecture, metadata -> config.json,
                    tensor names), or None where nexttok reads no GGUF of it
        renames     checkpoint tensor names -> ours, where the family's checkpoints name modules
                    otherwise (Mixtral's block_sparse_moe.experts.N.w1 -> mlp.experts.N.gate_proj)
        transforms  tensors stored in another layout than ours (gpt-oss's experts: transposed,
                    gate and up interleaved), rearranged as they are read (given the config:
                    Qwen3-Next's projections interleave their parts per key head)

Each family's file declares its entries (ARCHITECTURES at its end); adding a family is that file,
one line in FAMILIES below, and a spec in tests/tiny_models.py. Everything else derives from
here: which model_types config.json may name, which GGUF architectures load, the GGUF tensor
tables, the one-line refusal of anything else.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from nexttok.models import (
    exaone4,
    gemma3,
    gemma4,
    glm4_moe,
    gpt2,
    gpt_oss,
    granite,
    granitemoe,
    lfm2,
    llama,
    mixtral,
    olmo2,
    olmoe,
    phi3,
    qwen3,
    qwen3_next,
    qwen_moe,
    smollm3,
)
from nexttok.models.architecture import Architecture
from nexttok.models.config import ConfigError, ModelConfig, eos_token_ids, optional_int

FAMILIES = (gpt2, llama, qwen3, phi3, gemma3, gemma4, smollm3, olmo2, granite, exaone4, lfm2, qwen3_next, qwen_moe,
            mixtral, olmoe, gpt_oss, glm4_moe, granitemoe)
ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for family in FAMILIES for a in family.ARCHITECTURES}
# the first family of each GGUF architecture reads its files (llama's config function says "mixtral"
# where a llama file has experts)
GGUF_ARCHITECTURES: dict[str, Architecture] = {
    arch: next(a for a in ARCHITECTURES.values() if a.gguf is not None and a.gguf.arch == arch)
    for arch in dict.fromkeys(a.gguf.arch for a in ARCHITECTURES.values() if a.gguf is not None)}
HINTS = {"gemma3": gemma3.MULTIMODAL}  # model_types that are not ours but close to one
# multimodal checkpoints whose text model (config.json's text_config) we run: model_type -> the text model's
TEXT_MODELS = {**qwen3_next.MULTIMODAL}


def architecture(model_type) -> Architecture:
    """The entry of a model_type; ConfigError listing the supported ones otherwise."""
    if model_type not in ARCHITECTURES:
        raise ConfigError(f"model_type {model_type!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
                          f"{HINTS.get(model_type, '')}")
    return ARCHITECTURES[model_type]


def gguf_architecture(arch) -> Architecture:
    """The entry of a GGUF general.architecture; ConfigError listing the supported ones otherwise."""
    if arch not in GGUF_ARCHITECTURES:
        raise ConfigError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(GGUF_ARCHITECTURES)})")
    return GGUF_ARCHITECTURES[arch]


def from_hf_config(hf: dict) -> ModelConfig:
    """ModelConfig from a parsed HF config.json; unknown keys ignored.

    from_hf_config({"model_type": "gpt2", "n_embd": 768, ...}).hidden_size == 768
    """
    if not isinstance(hf, dict):
        raise ConfigError(f"config must be a JSON object, got {type(hf).__name__}")
    hf = text_model(hf)
    model_type = hf.get("model_type")
    entry = architecture(model_type)
    if entry.text_config:
        hf = text_config(hf)
    try:
        return ModelConfig(model_type=model_type, bos_token_id=optional_int(hf, "bos_token_id"),
                           eos_token_id=eos_token_ids(hf.get("eos_token_id")),
                           torch_dtype=hf.get("torch_dtype") or hf.get("dtype"), **entry.fields(hf))
    except KeyError as e:
        raise ConfigError(f"config.json for {model_type} is missing {e.args[0]!r}") from None
    except TypeError as e:
        raise ConfigError(f"config.json for {model_type} has a value of the wrong type: {e}") from None


TOP_LEVEL = ("bos_token_id", "eos_token_id", "torch_dtype", "dtype")  # a multimodal config's own, where set


def text_config(hf: dict) -> dict:
    """The text model's config of a multimodal config.json: its text_config, with the top level's
    token ids and dtype where the top level sets them.

    text_config({"text_config": {"hidden_size": 8, "eos_token_id": 1}, "eos_token_id": [1, 106]})
    == {"hidden_size": 8, "eos_token_id": [1, 106]}"""
    nested = hf.get("text_config")
    if not isinstance(nested, dict):
        raise ConfigError(f"config.json for {hf.get('model_type')} has no text_config object (the text model's config)")
    return {**nested, **{key: hf[key] for key in TOP_LEVEL if hf.get(key) is not None}}


def text_model(hf: dict) -> dict:
    """A multimodal config.json (TEXT_MODELS) as its text model's: text_config's keys over the
    top level's (the token ids may be at either level), under the text model's model_type; but
    tie_word_embeddings the top level's, as HF's multimodal model ties its lm_head by that."""
    model_type = hf.get("model_type")
    if model_type not in TEXT_MODELS:
        return hf
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"config.json for {model_type} has no text_config object")
    tied = {"tie_word_embeddings": hf["tie_word_embeddings"]} if "tie_word_embeddings" in hf else {}
    top = {k: v for k, v in hf.items() if k != "text_config"}
    return {**top, **text, **tied, "model_type": TEXT_MODELS[model_type]}


def read_config(directory: Path) -> ModelConfig:
    """The ModelConfig of a checkpoint directory's config.json."""
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"no config.json in {directory}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
    return from_hf_config(data)


def build_model(config: ModelConfig) -> nn.Module:
    """The modules of config's architecture on the meta device: shapes, no storage, no values
    (the loader puts the weights in; the random init of a meta tensor does nothing)."""
    with torch.device("meta"):
        return architecture(config.model_type).model(config)
