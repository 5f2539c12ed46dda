"""`nexttok pull`, `list`, `rm` and `cp`: the model store (checkpoints/store.py), as Ollama's commands
keep theirs; `nexttok ps`: the models a running server holds."""

from __future__ import annotations

import argparse
import datetime

from rich.console import Console

from nexttok.cli import common
from nexttok.cli.pulling import pull_with_progress


def cmd_pull(args: argparse.Namespace, out: Console) -> int:
    manifest = pull_with_progress(args.model, Console(stderr=True, soft_wrap=True))
    out.print(f"pulled {common.escape(manifest.name)} ({common.escape(manifest.source['file'])}, "
              f"{human_bytes(manifest.size)}, sha256 {manifest.sha256[:12]})")
    return 0


def cmd_list(args: argparse.Namespace, out: Console) -> int:
    from nexttok.checkpoints import store

    now = datetime.datetime.now(datetime.UTC)
    rows = [(m.name, m.sha256[:12], human_bytes(m.size), human_ago((now - m.modified).total_seconds()))
            for m in store.models()]
    print_columns(out, ("NAME", "ID", "SIZE", "MODIFIED"), rows)
    return 0


def cmd_rm(args: argparse.Namespace, out: Console) -> int:
    from nexttok.checkpoints import store

    for name in args.models:
        removed = store.remove(name)
        out.print(f"deleted {common.escape(repr(removed.name))}")
    return 0


def cmd_cp(args: argparse.Namespace, out: Console) -> int:
    from nexttok.checkpoints import store

    copied = store.copy(args.source, args.destination)
    out.print(f"copied {common.escape(repr(store.find_any(args.source).name))} to {common.escape(repr(copied.name))}")
    return 0


def cmd_ps(args: argparse.Namespace, out: Console) -> int:
    from nexttok.cli import client

    if not client.answering():
        raise OSError(f"no nexttok server answers at {client.server_url()} (start one: nexttok serve; "
                      "NEXTTOK_HOST says where to look)")
    now = datetime.datetime.now(datetime.UTC)
    rows = []
    for model in client.get_json("/api/ps")["models"]:
        until = datetime.datetime.fromisoformat(model["expires_at"].replace("Z", "+00:00"))
        left = (until - now).total_seconds()
        rows.append((model["name"], model["digest"][:12], human_bytes(model["size"]),
                     "100% GPU" if model["size_vram"] else "100% CPU", str(model["context_length"]),
                     "Forever" if until.year > 2200 else "Stopping..." if left <= 0 else human_ago(left, "from now")))
    print_columns(out, ("NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"), rows)
    return 0


def print_columns(out: Console, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Columns as `ollama list` prints them (Go's tabwriter: each as wide as its longest cell, then
    4 spaces), never cut to the terminal's width."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        line = "".join(f"{cell:<{width + 4}}" for cell, width in zip(row[:-1], widths[:-1], strict=True))
        out.print(line + str(row[-1]), markup=False, highlight=False, overflow="ignore", crop=False)


def human_ago(seconds: float, suffix: str = "ago") -> str:
    """As Ollama writes a moment (Go's units.HumanDuration): human_ago(150) == "2 minutes ago"."""
    s = abs(seconds)
    units = ((60, "second", 1), (3600, "minute", 60), (172800, "hour", 3600), (1209600, "day", 86400),
             (5184000, "week", 604800), (63072000, "month", 2592000), (float("inf"), "year", 31536000))
    unit, scale = next((u, k) for limit, u, k in units if s < limit)
    if s < 1:
        return f"Less than a second {suffix}"
    count = int(s // scale)
    if count == 1 and unit in ("minute", "hour"):
        return f"About a{'n' if unit == 'hour' else ''} {unit} {suffix}"
    return f"{count} {unit}{'s' * (count != 1)} {suffix}"


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
    listing = sub.add_parser("list", help="the models in the model store (name, id, size, when stored)")
    listing.set_defaults(func=cmd_list)
    ps = sub.add_parser("ps", help="the models a running `nexttok serve` holds, and until when")
    ps.set_defaults(func=cmd_ps)
    rm = sub.add_parser("rm", help="remove models from the model store (a file goes when no name uses it)")
    rm.add_argument("models", nargs="+", metavar="MODEL")
    rm.set_defaults(func=cmd_rm)
    cp = sub.add_parser("cp", help="store a model under another name too (no bytes copied)")
    cp.add_argument("source", metavar="SOURCE")
    cp.add_argument("destination", metavar="DESTINATION")
    cp.set_defaults(func=cmd_cp)
