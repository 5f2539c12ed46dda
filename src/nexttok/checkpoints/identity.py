"""Which checkpoint this is, by its bytes: the sha256 a trace records, so that a replay on another
checkpoint fails instead of comparing two models.

A .gguf file: the sha256 of the file, as `sha256sum` prints it. A checkpoint directory: the sha256
of the lines "<sha256 of file>  <name>" (`sha256sum`'s own format) for config.json and its weight
files, sorted by name: the weights and the shape that reads them, not the tokenizer or the README.
Hashing reads the whole file (about 1 s a GB here), so the digest is kept in the nexttok cache under
the file's path, size and modification time: a changed file is hashed again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from nexttok.checkpoints.weights import checkpoint_files
from nexttok.home import cache_home

CHUNK = 1 << 20


def checkpoint_sha256(path: Path) -> str:
    """The sha256 of a .gguf file, or of a directory's config.json and weight files (above)."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    files = [path / "config.json", *checkpoint_files(path)]
    listing = "".join(f"{file_sha256(f)}  {f.name}\n" for f in sorted(files, key=lambda f: f.name))
    return hashlib.sha256(listing.encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, from the cache while its size and modification time are unchanged."""
    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    store = cache_home() / "sha256.json"
    known = _read(store)
    if key in known:
        return known[key]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    known[key] = digest.hexdigest()
    _write(store, known)
    return known[key]


def _read(store: Path) -> dict[str, str]:
    try:
        known = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _write(store: Path, known: dict[str, str]) -> None:
    """Best effort (a read-only cache only costs a new hash next time); atomic, so two processes
    never leave half a file."""
    with contextlib.suppress(OSError):
        store.parent.mkdir(parents=True, exist_ok=True)
        partial = store.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(known), encoding="utf-8")
        os.replace(partial, store)
