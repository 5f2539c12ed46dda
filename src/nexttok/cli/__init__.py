"""Command-line front end: argparse and rich over the library; nothing here computes. One module per
group of commands (text: tokenize, run; chat; explain: explain, neighbors; serve: serve, bench;
models: models, convert; store: pull, list, ps, rm, cp; traces: replay, diff)."""

from __future__ import annotations

import argparse
import os
import sys

from rich.console import Console

from nexttok.cli import chat, explain, models, serve, store, text, traces
from nexttok.cli.common import escape
from nexttok.home import cache_home


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nexttok", description="See how a language model makes text.")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (text, chat, explain, serve, models, store, traces):
        group.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # torch.compile's inductor reads its on-disk cache folder from the environment only; the
    # process is ours here, and spawned workers (tensor-parallel ranks, bench engines) inherit it
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_home() / "inductor"))
    out = Console(soft_wrap=True)
    try:
        return args.func(args, out)
    except (OSError, ValueError, TypeError) as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {escape(str(e))}")  # one line, unwrapped
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
