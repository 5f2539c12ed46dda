"""GGUF → HF checkpoint layout (config.json, model.safetensors, tokenizer.json, ...).

We convert a GGUF once into the layout every other checkpoint has, so it loads through exactly the
same path (loading.load_model, tokenizer_json.from_directory) and HF transformers can load it too.
What each file holds is gguf.py's mapping; this module only writes it out, atomically.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from nexttok.checkpoints.gguf.reader import read_gguf


def convert_gguf(path: str | Path, out_dir: str | Path) -> Path:
    """Write the GGUF at `path` as an HF checkpoint directory `out_dir` (created atomically)."""
    from safetensors.numpy import save_file

    path, out_dir = Path(path), Path(out_dir)
    gguf = read_gguf(path)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        save_file(dict(gguf.tensors()), str(work / "model.safetensors"),
                  metadata={"format": "pt", "source": path.name})
        _write_json(work / "config.json", gguf.config)
        _write_json(work / "generation_config.json", gguf.generation_config)
        _write_json(work / "tokenizer.json", gguf.tokenizer)
        _write_json(work / "tokenizer_config.json", gguf.tokenizer_config)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out_dir


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
