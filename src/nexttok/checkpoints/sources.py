"""Where a checkpoint lives: a name → a local directory of HF files or a .gguf file, and a tokenizer.

A name is a local directory; a .gguf file; a bundled model name or "default" (its GGUF file, in
its package or joined from part packages into the nexttok cache: bundled.py); a name `nexttok pull`
stored (hf.co/ORG/REPO:QUANT, found also as ORG/REPO:QUANT or ORG/REPO for :latest: store.py); or
a Hugging Face hub id, found in the HF cache or downloaded. This is the only module that knows where
things live (bundled.py and store.py are its lower half). It imports no torch, so `nexttok tokenize`
and `import nexttok` stay light; loading.py builds a model from what is found here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nexttok.checkpoints import store
from nexttok.checkpoints.bundled import (
    BUNDLED_MODELS,
    BUNDLED_TOKENIZERS,
    DEFAULT_MODEL,
    bundled_model_file,
    tokenizer_dir,
)
from nexttok.home import cache_home
from nexttok.tokenizers.from_json import from_directory, from_tokenizer_json, tokenizer_from_json
from nexttok.tokenizers.tokenizer import Tokenizer

if TYPE_CHECKING:
    from nexttok.checkpoints.gguf.reader import GGUFFile

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"]
CHECKPOINT_FILES = ["config.json", "generation_config.json", "*.safetensors",
                    "model.safetensors.index.json", *TOKENIZER_FILES]


class CheckpointNotFound(FileNotFoundError):
    """A model name that is neither a local path, bundled, cached, nor downloadable now."""


def open_gguf(path: Path) -> GGUFFile:
    """A GGUF file, its parsed metadata kept in the nexttok cache (the next open is instant)."""
    from nexttok.checkpoints.gguf.reader import read_gguf  # the reader maps onto models/, which brings torch

    return read_gguf(path, index_dir=cache_home() / "gguf")


def gguf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer in a GGUF file's metadata, read alone: any architecture, weights or none."""
    from nexttok.checkpoints.gguf.reader import read_gguf_tokenizer

    tokenizer, _ = read_gguf_tokenizer(path, index_dir=cache_home() / "gguf")
    return tokenizer_from_json(tokenizer, f"{path.name} (tokenizer metadata)")


def looks_like_path(name: str) -> bool:
    """A name meant as a local path rather than a hub id: looks_like_path("./m") is True."""
    return name.startswith(("/", "./", "../", "~")) or "\\" in name


def local_checkpoint(source: str | Path, *, missing: str = "file or directory") -> Path | None:
    """The checkpoint a source names without the hub: a directory; a .gguf file; the GGUF file of
    a bundled model name or "default", or of a stored name. None for anything else (a hub id, or a
    file that is not a GGUF); FileNotFoundError("no such {missing}") for a path that does not exist."""
    path, name = Path(source), str(source)
    if path.is_dir():
        return path
    if path.is_file():
        return path if path.suffix == ".gguf" else None
    if name in BUNDLED_MODELS or name == "default":
        return bundled_model_file(DEFAULT_MODEL if name == "default" else name)
    if looks_like_path(name):
        raise FileNotFoundError(f"no such {'GGUF file' if path.suffix == '.gguf' else missing}: {name}")
    stored = store.find(name)
    if stored is not None:
        return stored.blob
    if wants_pull(name):
        raise CheckpointNotFound(f"{name} is not pulled yet: nexttok pull {name}")
    return None


def wants_pull(name: str) -> bool:
    """A name only `nexttok pull` can bring: hf.co/ORG/REPO[:QUANT], or ORG/REPO:QUANT (a hub id
    has no tag); wants_pull("org/repo") is False (a hub checkpoint, fetched by its id)."""
    parsed = store.parse_or_none(name)
    if parsed is None or not parsed.host or looks_like_path(name):
        return False
    return name.lower().startswith(store.HUB_ALIASES) or ":" in name


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


def resolve_checkpoint(source: str | Path) -> Path:
    """A checkpoint directory or .gguf file: a local directory; a .gguf file; a bundled model name
    (or "default": its GGUF); or a hub id fetched to (or found in) the HF cache."""
    found = local_checkpoint(source, missing="checkpoint directory")
    if found is not None:
        return found
    if Path(source).exists():
        from nexttok.models.config import CheckpointError

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
    found = local_checkpoint(source)
    if found is not None and found.is_file():  # a GGUF: the tokenizer is in its metadata
        return gguf_tokenizer(found)
    if found is not None:
        return from_directory(found)
    return from_directory(hub_snapshot(name, TOKENIZER_FILES))
