"""`nexttok pull`: models from the Hugging Face hub into the model store, as Ollama's commands keep them."""

from __future__ import annotations

import argparse

from rich.console import Console

from nexttok.cli import common
from nexttok.cli.pulling import pull_with_progress


def cmd_pull(args: argparse.Namespace, out: Console) -> int:
    manifest = pull_with_progress(args.model, Console(stderr=True, soft_wrap=True))
    out.print(f"pulled {common.escape(manifest.name)} ({common.escape(manifest.source['file'])}, "
              f"{human_bytes(manifest.size)}, sha256 {manifest.sha256[:12]})")
    return 0


def human_bytes(n: int) -> str:
    """As `ollama list` writes a size (powers of 1000): human_bytes(4_661_224_676) == "4.7 GB"."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n} B"


def add_parsers(sub) -> None:
    pull = sub.add_parser("pull", help="download a GGUF model from the Hugging Face hub into the model store")
    pull.add_argument("model", metavar="hf.co/ORG/REPO[:QUANT]",
                      help="a hub repo of GGUF files (hf.co/ optional); QUANT picks the file (Q4_K_M, Q8_0, ...; "
                      "default: Q4_K_M, else another Q4, else the first), as `ollama pull` and llama.cpp's -hf do")
    pull.set_defaults(func=cmd_pull)
