"""Where a checkpoint lives: a name → a local directory of HF files, and a name → a tokenizer.

A name is a local directory; a .gguf file (converted once into the nexttok cache); a bundled
model name or "default"; or a Hugging Face hub id, found in the HF cache or downloaded. This is
the only module that knows where things live. It imports no torch, so `nexttok tokenize` and
`import nexttok` stay light; loading.py builds a model from the directory found here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from nexttok.bundled import BUNDLED_MODELS, BUNDLED_TOKENIZERS, DEFAULT_MODEL, bundled_model_file, tokenizer_dir
from nexttok.config import CheckpointError
from nexttok.convert import convert_gguf
from nexttok.tokenizer import Tokenizer
from nexttok.tokenizer_json import from_directory, from_tokenizer_json

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"]
CHECKPOINT_FILES = ["config.json", "generation_config.json", "*.safetensors",
                    "model.safetensors.index.json", *TOKENIZER_FILES]

OnConvert = Callable[[Path], None]  # told the target directory before a GGUF conversion starts


class CheckpointNotFound(FileNotFoundError):
    """A model name that is neither a local path, bundled, cached, nor downloadable now."""


def cache_home() -> Path:
    """$NEXTTOK_HOME, else $XDG_CACHE_HOME/nexttok, else ~/.cache/nexttok."""
    if os.environ.get("NEXTTOK_HOME"):
        return Path(os.environ["NEXTTOK_HOME"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nexttok"


def fingerprint(path: Path) -> str:
    """Short id of a file's content (size + sha256 of its first and last MiB)."""
    digest = hashlib.sha256(str(path.stat().st_size).encode())
    with path.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, path.stat().st_size - (1 << 20)))
        digest.update(f.read())
    return digest.hexdigest()[:12]


def gguf_checkpoint(gguf: Path, name: str, on_convert: OnConvert | None = None) -> Path:
    """HF checkpoint directory for a GGUF file, converting it on first use."""
    target = cache_home() / "models" / f"{name}-{fingerprint(gguf)}"
    if not (target / "config.json").is_file():
        if on_convert is not None:
            on_convert(target)
        convert_gguf(gguf, target)
    return target


def bundled_model_dir(name: str, on_convert: OnConvert | None = None) -> Path:
    """Checkpoint directory of a bundled model (converted from its GGUF on first use)."""
    return gguf_checkpoint(bundled_model_file(name), name, on_convert)


def looks_like_path(name: str) -> bool:
    """A name meant as a local path rather than a hub id: looks_like_path("./m") is True."""
    return name.startswith(("/", "./", "../", "~")) or "\\" in name


def local_checkpoint(source: str | Path, *, missing: str = "file or directory",
                     on_convert: OnConvert | None = None) -> Path | None:
    """The checkpoint directory a source names without the hub: a directory; a .gguf file
    (converted once); a bundled model name or "default". None for anything else (a hub id, or a
    file that is not a GGUF); FileNotFoundError("no such {missing}") for a path that does not exist."""
    path, name = Path(source), str(source)
    if path.is_dir():
        return path
    if path.is_file():
        return gguf_checkpoint(path, path.stem, on_convert) if path.suffix == ".gguf" else None
    if name in BUNDLED_MODELS or name == "default":
        return bundled_model_dir(DEFAULT_MODEL if name == "default" else name, on_convert)
    if looks_like_path(name):
        raise FileNotFoundError(f"no such {missing}: {name}")
    return None


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


def resolve_checkpoint(source: str | Path, on_convert: OnConvert | None = None) -> Path:
    """Directory of a checkpoint: a local directory; a .gguf file (converted once into the nexttok
    cache); a bundled model name (or "default"); or a hub id fetched to (or found in) the HF cache.
    on_convert(target) is called before a GGUF conversion starts (it takes a few seconds)."""
    directory = local_checkpoint(source, missing="checkpoint directory", on_convert=on_convert)
    if directory is not None:
        return directory
    if Path(source).exists():
        raise CheckpointError(
            f"{source} is a file; give the checkpoint directory (config.json + *.safetensors)"
        )
    return hub_snapshot(str(source), CHECKPOINT_FILES)


def load_tokenizer(source: str | Path) -> Tokenizer:
    """A tokenizer from a file, a model directory, a bundled name (`gpt2`, the default model's
    name or `default`), or a hub id."""
    path, name = Path(source), str(source)
    if path.is_file() and path.suffix != ".gguf":
        return from_tokenizer_json(path)
    if name in BUNDLED_TOKENIZERS and not path.exists():
        directory = tokenizer_dir(name)
        if directory is not None and directory.is_dir():
            return from_directory(directory)
    directory = local_checkpoint(source)
    if directory is not None:
        return from_directory(directory)
    return from_directory(hub_snapshot(name, TOKENIZER_FILES))
