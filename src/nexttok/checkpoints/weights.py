"""Safetensors weights into a model: which files hold them, reading tensors one at a time, and
copying each in by its checkpoint name with its shape and dtype checked.

Each architecture gives a short rename table (a prefix, the names stored transposed). Pickle
files (.bin/.pt) are refused: unpickling can run arbitrary code. Finding a checkpoint is
sources.py's job, building the model around these weights loading.py's. check_memory refuses,
before anything is allocated, a model bigger than the memory it would load into.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from nexttok.models.config import CheckpointError, ModelConfig
from nexttok.models.fused import FusedLinear, fused_parts
from nexttok.models.quant import BITS
from nexttok.models.registry import architecture

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
# tensors some checkpoints carry that the model derives itself
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


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


def checkpoint_keys(model, name: str) -> list[str]:
    """Names our parameter may have in a checkpoint: prefixed, or bare as in old GPT-2 files."""
    return [name] if name.startswith(model.UNPREFIXED) else [model.CHECKPOINT_PREFIX + name, name]


def tensor_parts(model: torch.nn.Module, name: str, shape: torch.Size) -> list[tuple[str, tuple[int, ...]]]:
    """(our checkpoint name, shape) of each tensor that makes parameter `name`, stacked in order:
    the stacked parts of a fused projection (q, k, v rows of qkv_proj.weight), or of experts kept
    one tensor each (experts.0.gate_proj.weight, experts.0.up_proj.weight, ...: moe.Experts)."""
    module_name, leaf = name.rsplit(".", 1)
    module = model.get_submodule(module_name)
    if isinstance(module, FusedLinear):
        return [(f"{part}.{leaf}", (rows, *shape[1:])) for part, rows in fused_parts(module_name, module).items()]
    if hasattr(module, "checkpoint_parts"):
        return [(f"{module_name}.{part}", part_shape) for part, part_shape in module.checkpoint_parts(leaf)]
    return [(name, tuple(shape))]


def assign_weights(model: torch.nn.Module, files: list[Path]) -> None:
    """Copy every parameter from the checkpoint, checking names, shapes and dtypes. The family's
    renames (registry.py) put the checkpoint's names in our terms first; a tensor stored whole
    where ours is stacked from parts (gpt-oss's, Granite's 3-D experts) is read whole, in the
    layout the family's transforms give it."""
    entry = architecture(model.config.model_type)
    index = _TensorIndex(files)
    stored = {entry.checkpoint_name(key): key for key in index.where}  # our name -> the checkpoint's
    used = set()
    tied = model.config.tie_word_embeddings
    for name, param in model.state_dict(keep_vars=True).items():
        if tied and name == "lm_head.weight":
            continue  # shares the embedding's tensor
        value = _read_whole(model, entry, index, stored, name, tuple(param.shape), used)
        if value is None:
            parts = [_read_part(model, index, stored, part, shape, used)
                     for part, shape in tensor_parts(model, name, param.shape)]
            value = (parts[0] if len(parts) == 1 else torch.cat(parts)).reshape(param.shape)
        with torch.no_grad():
            param.copy_(value)
    index.close()
    unused = set(index.where) - used
    if entry.unused is not None:
        unused = {k for k in unused if not entry.unused(k, model.config.num_hidden_layers)}
    _check_unused(unused, tied)


def _read_whole(model, entry, index: _TensorIndex, stored: dict[str, str], name: str, shape: tuple[int, ...],
                used: set[str]) -> torch.Tensor | None:
    """Parameter `name`, stacked from parts in our modules, stored as one tensor (in the layout the
    family's transforms say, where they say one), or None."""
    transform = next((fn for suffix, fn in entry.transforms.items() if name.endswith(suffix)), None)
    stacked = hasattr(model.get_submodule(name.rsplit(".", 1)[0]), "checkpoint_parts")
    key = next((stored[c] for c in checkpoint_keys(model, name) if c in stored), None)
    if key is None or not (stacked or transform):
        return None
    tensor = _floating(index, key)
    tensor = tensor if transform is None else transform(tensor, model.config)
    if tuple(tensor.shape) != shape:
        raise CheckpointError(f"tensor {key!r} gives shape {tuple(tensor.shape)}, expected {shape} for this config")
    used.add(key)
    return tensor


def _floating(index: _TensorIndex, key: str) -> torch.Tensor:
    tensor = index.get(key)
    if not tensor.is_floating_point():
        raise CheckpointError(f"tensor {key!r} has dtype {tensor.dtype}, expected floating point")
    return tensor


def _read_part(model, index: _TensorIndex, stored: dict[str, str], name: str, shape: tuple[int, ...],
               used: set[str]) -> torch.Tensor:
    candidates = checkpoint_keys(model, name)
    key = next((stored[c] for c in candidates if c in stored), None)
    if key is None:
        raise CheckpointError(f"tensor {candidates[0]!r} is missing from the checkpoint")
    tensor = _floating(index, key)
    if name.endswith(model.TRANSPOSED):
        tensor = tensor.T
    if tuple(tensor.shape) != shape:
        raise CheckpointError(f"tensor {key!r} has shape {tuple(tensor.shape)}, expected {shape} for this config")
    used.add(key)
    return tensor


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
        chosen = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device {device!r} is not valid: {e}") from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        why = "this PyTorch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ValueError(f"device {device!r} is not available: {why} (use --device cpu)")
    return chosen


class NotEnoughMemory(ValueError):
    """A model too big for the memory of the device it would load on."""


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a model's parameters and buffers take once materialized; works on the meta device,
    before anything is allocated (a tied tensor counts once)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def check_memory(needed: int, device: torch.device) -> None:
    """Refuse a model that cannot fit, before allocating it: the allocator would fail half-way
    with a traceback, or the system start swapping or killing processes. Skipped where the free
    memory cannot be known."""
    available = available_memory(device)
    if available is not None and needed > available:
        where = "is available" if device.type == "cpu" else f"is free on {device}"
        raise NotEnoughMemory(f"model needs {format_bytes(needed)} of memory for its weights but "
                              f"{format_bytes(available)} {where}")


def available_memory(device: torch.device) -> int | None:
    """Free bytes on `device`: CUDA's own count; on the CPU, Linux's MemAvailable plus free swap
    (memory the kernel can still hand out: a model that fits only with swap is slow, not an
    error). None elsewhere (other systems and device types)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        lines = Path("/proc/meminfo").read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    kib = {}
    for line in lines:  # "MemAvailable:   22808744 kB"
        key, _, value = line.partition(":")
        number = value.split()[:1]
        if number and number[0].isdigit():
            kib[key] = int(number[0])
    if "MemAvailable" not in kib:  # Linux before 3.14
        return None
    return (kib["MemAvailable"] + kib.get("SwapFree", 0)) * 1024


def format_bytes(n: int) -> str:
    """format_bytes(412_300_000_000) == "412.3 GB"; decimal units, as disk and RAM sizes are sold."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:,} bytes"


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device, config: ModelConfig) -> torch.dtype:
    """float32 on CPU unless asked; on CUDA the checkpoint's half type (bfloat16 when unstated)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        if device.type == "cpu" or config.torch_dtype == "float32":
            return torch.float32
        return DTYPES.get(config.torch_dtype or "", torch.bfloat16)
    check_dtype(dtype)
    return DTYPES[dtype]


def check_dtype(dtype) -> None:
    """A dtype name the loaders take (or a torch.dtype); ValueError naming the choices otherwise."""
    if not (dtype is None or isinstance(dtype, torch.dtype) or dtype in ("auto", *BITS, *DTYPES)):
        raise ValueError(f"dtype must be one of auto, {', '.join(BITS)}, {', '.join(DTYPES)}; got {dtype!r}")
