"""What a registry entry holds (registry.py): an architecture's model class, how its config.json and
GGUF metadata read, its GGUF tensor names and its checkpoint renames. Each family's file declares
its entries with these; registry.py collects them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from nexttok.models.config import ConfigError, ModelConfig


@dataclass(frozen=True)
class GGUFMeta:
    """A GGUF file's metadata as an architecture's config function reads it: key("block_count")
    is "<arch>.block_count"'s value (ConfigError naming it where it is missing and no default)."""

    values: Mapping
    tensor_names: frozenset[str]
    tokens: list[str]
    # the values of the file's tensors that the layout derives from the config (GGUFLayout.derived)
    vectors: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    @property
    def arch(self) -> str:
        return self.values["general.architecture"]

    def key(self, name: str, default=None):
        value = self.values.get(f"{self.arch}.{name}", default)
        if value is None:
            raise ConfigError(f"GGUF metadata {self.arch}.{name} is missing")
        return value

    def get(self, name: str, default=None):
        """"<arch>.<name>"'s value, or default."""
        return self.values.get(f"{self.arch}.{name}", default)

    def layer_types(self, layers: int, every: int) -> list[str]:
        """Which layers slide, as llama.cpp's load_swa_pattern reads attention.sliding_window_pattern:
        a bool per layer, or n (the last of every n layers global; 0: all slide), by default `every`.

        with the pattern 4 (or absent and every 4): ["sliding_attention"] * 3 + ["full_attention"] + ...
        """
        pattern = self.get("attention.sliding_window_pattern", every)
        if isinstance(pattern, list):
            if len(pattern) != layers:
                raise ConfigError(f"GGUF metadata {self.arch}.attention.sliding_window_pattern has {len(pattern)} "
                                  f"entries for {layers} layers")
            sliding = [bool(s) for s in pattern]
        elif type(pattern) is int and pattern >= 0:
            sliding = [pattern == 0 or i % pattern < pattern - 1 for i in range(layers)]
        else:
            raise ConfigError(f"GGUF metadata {self.arch}.attention.sliding_window_pattern {pattern!r} is not "
                              "a list of booleans or a count")
        return ["sliding_attention" if s else "full_attention" for s in sliding]


def representable(ok: bool, what: str) -> None:
    """Refuse (ConfigError) to write a GGUF that llama.cpp would run otherwise than the checkpoint."""
    if not ok:
        raise ConfigError(f"llama.cpp's GGUF cannot hold {what}")


@dataclass(frozen=True)
class GGUFLayout:
    """How llama.cpp writes a family. tensors: llama.cpp's name -> ours, global ("output.weight")
    or per block ("attn_q.weight", under "blk.N."; ours under block + "N."). permuted: our names
    (suffixes) whose rows llama.cpp interleaves for its RoPE kernel (convert_hf_to_gguf permutes
    Llama's q and k). norm_offset: what llama.cpp adds to every norm weight (Gemma's 1). values: our
    name suffix -> (the file's values -> ours, ours -> the file's), numpy arrays, for the float tensors
    llama.cpp's converter stores as a function of HF's (Qwen3-Next's zero-centred norms as 1 + w)."""

    arch: str
    config: Callable[[GGUFMeta], dict]
    tensors: Mapping[str, str]
    block: str = "model.layers."
    permuted: tuple[str, ...] = ()
    norm_offset: float = 0.0
    values: Mapping[str, tuple[Callable, Callable]] = field(default_factory=dict)
    # (our name, float32 array, config) -> the array as llama.cpp's converter writes it, for a family whose
    # files order something otherwise than its checkpoints and the reader keeps the file's order (qwen35's
    # value heads, tiled: config.linear_value_heads_tiled)
    rearrange: Callable[[str, object, ModelConfig], object] | None = None
    hf_class: str = ""  # config.json's "architectures" entry for a checkpoint converted from the file
    metadata: Callable[[ModelConfig], dict] | None = None  # config -> "<arch>." keys: how checkpoints/export.py
    # writes the family (config's inverse); None where nexttok writes no GGUF of it
    # llama.cpp's name -> (config -> float32 array): tensors its files hold that the checkpoint does not,
    # derived from the config (gemma4's rope_freqs: the full layers' RoPE); the reader gives their values
    # to `config` (GGUFMeta.vectors) and loads no weight from them, the exporter writes them
    derived: Mapping[str, Callable[[ModelConfig], object]] = field(default_factory=dict)


@dataclass(frozen=True)
class Architecture:
    model_type: str
    model: type[nn.Module]
    fields: Callable[[dict], dict]
    gguf: GGUFLayout | None = None
    renames: tuple[tuple[str, str], ...] = ()  # (checkpoint name part, ours), applied in order
    # (a tensor as stored, the config) -> ours
    transforms: Mapping[str, Callable[[torch.Tensor, ModelConfig], torch.Tensor]] = field(default_factory=dict)
    unused: Callable[[str, int], bool] | None = None  # (checkpoint name, num_hidden_layers): left unread on purpose
    # config.json nests the text model's config under "text_config" (a multimodal checkpoint whose
    # text part nexttok runs: Gemma 4's); token ids and dtype at the top level win over the nested ones
    text_config: bool = False

    def checkpoint_name(self, name: str) -> str:
        """A checkpoint tensor's name in our modules' terms (renames applied)."""
        for old, new in self.renames:
            name = name.replace(old, new)
        return name
