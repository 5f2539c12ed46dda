"""Finding checkpoints: local directories, and the Hugging Face hub (downloads need a network)."""

from __future__ import annotations

from pathlib import Path

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
