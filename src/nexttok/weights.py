"""Checkpoints: find them (local directory, HF cache, hub download) and load their weights.

A checkpoint is HF's layout: config.json + *.safetensors (sharded with an index, or one file).
Tensors are read one at a time with the safetensors library, renamed by each architecture's short
table (prefix, transposed names), and copied in with their shapes and dtypes checked. Pickle files
(.bin/.pt) are refused: unpickling can run arbitrary code.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from nexttok.config import ConfigError, ModelConfig, from_hf_config

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"]


class CheckpointNotFound(FileNotFoundError):
    """A model name that is neither a local path, bundled, cached, nor downloadable now."""


def hub_snapshot(repo_id: str, patterns: list[str]) -> Path:
    """Local directory holding `patterns` of hub repo `repo_id`: from the HF cache when there,
    else downloaded (with a progress bar). Clear error when offline and not cached."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError
    except ImportError:  # pragma: no cover - declared dependency
        raise CheckpointNotFound(
            f"{repo_id!r} is not a local path and huggingface_hub is not installed to fetch it"
        ) from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except HFValidationError as e:
        raise CheckpointNotFound(f"{repo_id!r} is neither a local path nor a valid hub id: {e}") from None
    except Exception:  # not cached: fall through to a download
        pass
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as e:
        raise CheckpointNotFound(
            f"{repo_id!r} is not a local path, not in the Hugging Face cache, and could not be "
            f"downloaded ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
            "Pass a local directory, or run once with network access."
        ) from None


# ---------------------------------------------------------------------------------------------

CHECKPOINT_FILES = ["config.json", "generation_config.json", "*.safetensors",
                    "model.safetensors.index.json", *TOKENIZER_FILES]
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
# tensors some checkpoints carry that the model derives itself
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


class CheckpointError(ValueError):
    """A checkpoint file that is missing, corrupt, or does not fit the model."""


def resolve_checkpoint(source: str | Path, on_convert=None) -> Path:
    """Directory of a checkpoint: a local directory; a .gguf file (converted once into the nexttok
    cache); a bundled model name (or "default"); or a hub id fetched to (or found in) the HF cache.
    on_convert(target) is called before a GGUF conversion starts (it takes a few seconds)."""
    from nexttok import bundled

    directory = bundled.local_checkpoint(source, missing="checkpoint directory", on_convert=on_convert)
    if directory is not None:
        return directory
    if Path(source).exists():
        raise CheckpointError(
            f"{source} is a file; give the checkpoint directory (config.json + *.safetensors)"
        )
    return hub_snapshot(str(source), CHECKPOINT_FILES)


def read_config(directory: Path) -> ModelConfig:
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"no config.json in {directory}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
    return from_hf_config(data)


def checkpoint_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint, from its shard index when it has one."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index} is malformed: {e!r}") from None
        files = [directory / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"shards listed in {index.name} are missing: {', '.join(missing)}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(
            f"{directory} has only pickle weights ({', '.join(pickles)}). nexttok never unpickles "
            "(loading a pickle can run arbitrary code); convert to safetensors first, e.g. "
            "transformers' from_pretrained(...).save_pretrained(dir, safe_serialization=True)"
        )
    raise CheckpointError(f"no *.safetensors weights in {directory}")


def diagnose_safetensors(path: Path) -> str:
    """Say what is wrong with a safetensors file, naming the tensor when one is at fault."""
    size = path.stat().st_size
    if size < 8:
        return f"{path.name} is {size} bytes: too short for a safetensors header"
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > size - 8:
            return f"{path.name}: header claims {header_len} bytes but the file has {size}"
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return f"{path.name}: header is not valid JSON ({e})"
    data_size = size - 8 - header_len
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            return f"{path.name}: tensor {name!r} has no valid data_offsets"
        if end > data_size:
            return (f"{path.name}: tensor {name!r} needs bytes {start}..{end} but the file holds "
                    f"{data_size} bytes of data (truncated?)")
    return f"{path.name} is not a valid safetensors file"


class _TensorIndex:
    """Tensor name -> file; tensors are read one at a time. The handle of a file is reopened
    after every REOPEN_BYTES read, which releases the pages it mapped: peak memory stays near the
    model's own size instead of model + file."""

    REOPEN_BYTES = 64 << 20

    def __init__(self, files: list[Path]):
        from safetensors import safe_open

        self._open = safe_open
        self.where: dict[str, Path] = {}
        self._handle, self._handle_path, self._read = None, None, 0
        for path in files:
            try:
                with safe_open(str(path), framework="pt") as handle:
                    for key in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                        self.where[key] = path
            except Exception as e:
                raise CheckpointError(f"cannot read {path}: {diagnose_safetensors(path)} ({e})") from None

    def get(self, key: str) -> torch.Tensor:
        path = self.where[key]
        if self._handle is None or self._handle_path != path or self._read > self.REOPEN_BYTES:
            self.close()
            self._handle, self._handle_path = self._open(str(path), framework="pt"), path
        try:
            tensor = self._handle.get_tensor(key)
        except Exception as e:
            raise CheckpointError(f"cannot read tensor {key!r} from {path.name}: {e}") from None
        self._read += tensor.numel() * tensor.element_size()
        return tensor

    def close(self) -> None:
        self._handle, self._handle_path, self._read = None, None, 0


def _checkpoint_keys(model, name: str) -> list[str]:
    """Names our parameter may have in a checkpoint: prefixed, or bare as in old GPT-2 files."""
    return [name] if name.startswith(model.UNPREFIXED) else [model.CHECKPOINT_PREFIX + name, name]


def assign_weights(model: torch.nn.Module, files: list[Path]) -> None:
    """Copy every parameter from the checkpoint, checking names, shapes and dtypes."""
    index = _TensorIndex(files)
    used = set()
    tied = getattr(model.config, "tie_word_embeddings", False)
    for name, param in model.state_dict(keep_vars=True).items():
        if tied and name == "lm_head.weight":
            continue  # shares the embedding's tensor
        candidates = _checkpoint_keys(model, name)
        key = next((c for c in candidates if c in index.where), None)
        if key is None:
            raise CheckpointError(f"tensor {candidates[0]!r} is missing from the checkpoint")
        tensor = index.get(key)
        if not tensor.is_floating_point():
            raise CheckpointError(f"tensor {key!r} has dtype {tensor.dtype}, expected floating point")
        if name.endswith(model.TRANSPOSED):
            tensor = tensor.T
        if tensor.shape != param.shape:
            raise CheckpointError(f"tensor {key!r} has shape {tuple(tensor.shape)}, "
                                  f"expected {tuple(param.shape)} for this config")
        with torch.no_grad():
            param.copy_(tensor)
        used.add(key)
    index.close()
    _check_unused(set(index.where) - used, tied)


def _check_unused(unused: set[str], tied: bool) -> None:
    unexpected = sorted(k for k in unused if not k.endswith(IGNORED_SUFFIXES)
                        and not (tied and k == "lm_head.weight"))
    if unexpected:
        shown = ", ".join(unexpected[:5]) + (" ..." if len(unexpected) > 5 else "")
        raise CheckpointError(f"checkpoint has {len(unexpected)} tensors this architecture does not use: "
                              f"{shown}")


def pick_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device {device!r} is not valid: {e}") from None


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device, config: ModelConfig) -> torch.dtype:
    """float32 on CPU unless asked; on CUDA the checkpoint's half type (bfloat16 when unstated)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        if device.type == "cpu" or config.torch_dtype == "float32":
            return torch.float32
        return DTYPES.get(config.torch_dtype or "", torch.bfloat16)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} or auto, got {dtype!r}")
    return DTYPES[dtype]


def load_model(source: str | Path, *, dtype: str | torch.dtype | None = None,
               device: str | None = None, on_convert=None) -> torch.nn.Module:
    """A ready model (eval mode) from any source resolve_checkpoint takes; model.config holds its
    config and model.directory the checkpoint directory."""
    from nexttok.models import build_model

    directory = resolve_checkpoint(source, on_convert)
    config = read_config(directory)
    files = checkpoint_files(directory)
    target = pick_device(device)
    chosen = pick_dtype(dtype, target, config)
    with torch.device("meta"):
        model = build_model(config)
    model = model.to_empty(device=target).to(chosen)
    model.tie_weights()  # materializing off the meta device unties shared parameters
    assign_weights(model, files)
    model.init_buffers()
    model.directory = directory
    return model.eval()


def read_generation_stop_ids(directory: Path) -> list[int]:
    """eos_token_id from generation_config.json (often longer than config.json's), if present."""
    path = directory / "generation_config.json"
    if not path.is_file():
        return []
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (ValueError, AttributeError):
        raise ConfigError(f"{path} is not a valid JSON object") from None
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(type(i) is int for i in ids):
        raise ConfigError(f"{path}: eos_token_id must be an integer or a list of integers")
    return ids


def load_checkpoint(source: str | Path, *, dtype: str | torch.dtype | None = None,
                    device: str | None = None, on_convert=None):
    """(model, tokenizer) from one checkpoint; stop ids from config.json and generation_config.json."""
    from nexttok.tokenizer import from_directory

    model = load_model(source, dtype=dtype, device=device, on_convert=on_convert)
    tokenizer = from_directory(model.directory)
    config = model.config
    for i in read_generation_stop_ids(model.directory):
        if i not in config.eos_token_id:
            config.eos_token_id.append(i)
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(f"tokenizer has {tokenizer.vocab_size} ids but the model only "
                              f"{config.vocab_size} embeddings")
    return model, tokenizer
