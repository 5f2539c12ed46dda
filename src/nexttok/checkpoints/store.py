"""The models `nexttok pull` stores, kept as Ollama keeps its own: a small manifest per name, the
bytes once per sha256 (a copy under another name costs nothing; removing a name removes the bytes
when no other name uses them).

    <models_home>/manifests/hf.co/<org>/<repo>/<tag>   {"name": "hf.co/Org/Repo:Q4_K_M", "sha256": ...}
    <models_home>/blobs/sha256-<hex>.gguf             the GGUF file
    <models_home>/blobs/sha256-<hex>.gguf.partial     a download under way, or one that was cut

A name is Ollama's [host/][namespace/]model[:tag], matched without regard to case: a hub pull is
hf.co/ORG/REPO:TAG, found also as ORG/REPO:TAG; a copy may be a bare model[:tag]; no tag means
`latest`. Only this module and hub_pull.py (which fills it) know the layout; sources.py asks it
for a name's file. Nothing here reads the GGUF's contents.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from nexttok.home import models_home

HUB = "hf.co"
HUB_ALIASES = ("hf.co/", "huggingface.co/")
DEFAULT_TAG = "latest"
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")  # a hub org or repo name, or a model name
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


class NotStored(FileNotFoundError):
    """A name with no manifest in the store."""


@dataclass(frozen=True)
class ModelName:
    """A parsed model name: ModelName.parse("hf.co/Org/Repo:Q4_K_M").display == "hf.co/Org/Repo:Q4_K_M"."""

    host: str  # "hf.co" for a hub model, "" for a local name (a copy)
    namespace: str  # the hub org ("" for a local name)
    model: str
    tag: str

    @classmethod
    def parse(cls, text: str) -> ModelName:
        """ORG/REPO[:TAG] or hf.co/ORG/REPO[:TAG] (a hub model), or MODEL[:TAG]; ValueError otherwise.
        parse("org/repo").display == "hf.co/org/repo:latest"."""
        rest = re.sub(r"(?i)^https?://", "", text.strip())
        hub = next((a for a in HUB_ALIASES if rest.lower().startswith(a)), None)
        rest = rest[len(hub):] if hub else rest
        body, colon, tag = rest.rpartition(":") if ":" in rest.rsplit("/", 1)[-1] else (rest, "", "")
        if colon and not _TAG.fullmatch(tag):
            raise ValueError(f"{text!r}: {tag!r} is not a tag (letters, digits, '.', '_', '-')")
        parts = body.split("/")
        if len(parts) > 2 or (hub and len(parts) != 2) or not all(_PART.fullmatch(p) for p in parts):
            raise ValueError(f"{text!r} is not a model name: expected hf.co/ORG/REPO[:QUANT], ORG/REPO[:QUANT] "
                             "or NAME[:TAG]")
        if len(parts) == 2:
            return cls(HUB, parts[0], parts[1], tag or DEFAULT_TAG)
        return cls("", "", parts[0], tag or DEFAULT_TAG)

    @property
    def repo(self) -> str:
        """The hub repository: "Org/Repo" (a local name has none)."""
        return f"{self.namespace}/{self.model}" if self.host else ""

    @property
    def display(self) -> str:
        return f"{self.host}/{self.repo}:{self.tag}" if self.host else f"{self.model}:{self.tag}"

    @property
    def key(self) -> tuple[str, ...]:
        """Where its manifest is, below manifests/: the name's parts in lower case (names match
        regardless of case, as hub ids do)."""
        parts = (self.host, self.namespace, self.model, self.tag) if self.host else ("local", self.model, self.tag)
        return tuple(p.lower() for p in parts)


def parse_or_none(text: str) -> ModelName | None:
    try:
        return ModelName.parse(text)
    except ValueError:
        return None


@dataclass
class Manifest:
    """One stored name: its file's sha256 and size, where it came from and what it holds."""

    name: str
    sha256: str
    size: int
    source: dict | None = None  # {"endpoint", "repo", "revision", "file"} of a pull
    details: dict = field(default_factory=dict)  # format, family, parameter_size, quantization_level
    path: Path | None = None  # the manifest file (set when read or written)
    root: Path | None = None  # the store it is in

    @property
    def blob(self) -> Path:
        return blob_path(self.sha256, self.root)

    @property
    def modified(self) -> datetime.datetime:
        """When the name was stored (its manifest written), as `ollama list` shows it."""
        moment = self.path.stat().st_mtime if self.path is not None else 0.0
        return datetime.datetime.fromtimestamp(moment, datetime.UTC)

    def record(self) -> dict:
        return {"name": self.name, "sha256": self.sha256, "size": self.size, "source": self.source,
                "details": self.details}


def _root(root: Path | None) -> Path:
    return models_home() if root is None else root


def blob_path(sha256: str, root: Path | None = None) -> Path:
    """The stored file of that content: blob_path("ab12...") == <models_home>/blobs/sha256-ab12....gguf."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"not a sha256 digest: {sha256!r}")
    return _root(root) / "blobs" / f"sha256-{sha256}.gguf"


def partial_path(sha256: str, root: Path | None = None) -> Path:
    """Where a download of that content is written until its sha256 checks out."""
    blob = blob_path(sha256, root)
    return blob.with_name(blob.name + ".partial")


def _manifest_path(name: ModelName, root: Path | None) -> Path:
    return _root(root).joinpath("manifests", *name.key)


def find(name: str, root: Path | None = None) -> Manifest | None:
    """The manifest of a stored name whose file is there, or None (a name that cannot be one, too)."""
    parsed = parse_or_none(name)
    if parsed is None:
        return None
    manifest = _read(_manifest_path(parsed, root), _root(root))
    return manifest if manifest is not None and manifest.blob.is_file() else None


def models(root: Path | None = None) -> list[Manifest]:
    """Every stored name, the most recently stored first (as `ollama list`)."""
    folder = _root(root) / "manifests"
    files = [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")] if folder.is_dir() else []
    found = [_read(p, _root(root)) for p in files]
    return sorted((m for m in found if m is not None), key=lambda m: m.modified, reverse=True)


def write(manifest: Manifest, root: Path | None = None) -> Manifest:
    """Store the name (replacing what it named before); the blob must be in place already."""
    name = ModelName.parse(manifest.name)
    path = _manifest_path(name, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps({**manifest.record(), "name": name.display}, indent=1), encoding="utf-8")
    os.replace(temporary, path)  # a reader never sees half a manifest
    previous = _read(path, _root(root))
    assert previous is not None
    return previous


def remove(name: str, root: Path | None = None) -> Manifest:
    """Forget a stored name; its file goes too unless another name uses it. NotStored if none."""
    manifest = find_any(name, root)
    assert manifest.path is not None
    manifest.path.unlink()
    _prune(manifest.path.parent, _root(root) / "manifests")
    if not any(m.sha256 == manifest.sha256 for m in models(root)):
        manifest.blob.unlink(missing_ok=True)
    return manifest


def copy(source: str, destination: str, root: Path | None = None) -> Manifest:
    """Store the same file under another name (nothing is copied but the manifest)."""
    manifest = find_any(source, root)
    if find(source, root) is None:
        raise NotStored(f"model {source!r}: its file is missing from the store; pull it again")
    return write(Manifest(ModelName.parse(destination).display, manifest.sha256, manifest.size,
                          manifest.source, manifest.details), root)


def find_any(name: str, root: Path | None = None) -> Manifest:
    """The manifest of a stored name even when its file is missing; NotStored naming it if none."""
    manifest = _read(_manifest_path(ModelName.parse(name), root), _root(root))
    if manifest is None:
        raise NotStored(f"model {name!r} not found (`nexttok list` shows the stored models)")
    return manifest


def _read(path: Path, root: Path) -> Manifest | None:
    """A manifest file, or None when there is none or it is damaged (then it is not listed)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Manifest(str(data["name"]), str(data["sha256"]), int(data["size"]), data.get("source"),
                        dict(data.get("details") or {}), path, root)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _prune(folder: Path, top: Path) -> None:
    """Remove the empty folders a removed manifest leaves, up to manifests/."""
    while folder != top and top in folder.parents:
        with contextlib.suppress(OSError):
            folder.rmdir()  # fails (and stops) at the first folder that still holds something
        if folder.exists():
            return
        folder = folder.parent
