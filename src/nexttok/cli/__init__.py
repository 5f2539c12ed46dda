"""Command-line front end: argparse and rich over the library; nothing here computes. One module per
group of commands (text: tokenize, run; chat; explain: explain, neighbors; serve: serve, bench;
models: models, convert; store: pull, list, ps, rm, cp; traces: replay, diff)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import threading

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


# commands that end with every file they wrote closed and no thread of theirs left: their process may
# skip the interpreter's teardown (with torch loaded, 0.3-0.5 s after the answer is out)
QUICK_EXIT = ("run", "tokenize")


def main(argv: list[str] | None = None) -> int:
    return dispatch(build_parser().parse_args(argv))


def entry() -> int:
    """The `nexttok` command's and `python -m nexttok`'s start: main's, then for QUICK_EXIT commands
    in one thread (no --tensor-parallel ranks to close) the output flushed and the process ended at
    once, without collecting every module's objects first. The garbage collector runs every 50,000
    allocations rather than 700 for those commands: importing torch and loading a model make a few hundred thousand
    objects that live on, and checking them for cycles over and over took ~0.2 s of a run's start."""
    args = build_parser().parse_args()
    quick = args.command in QUICK_EXIT
    if quick:
        gc.set_threshold(50_000, 10, 10)
    code = dispatch(args)
    if quick and getattr(args, "tensor_parallel", 1) == 1 and threading.active_count() == 1:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (BrokenPipeError, ValueError):  # a reader that stopped, or a stream closed already
                pass
            except OSError:  # e.g. a full disk: the output is not whole
                code = code or 1
        os._exit(code)
    return code


def dispatch(args: argparse.Namespace) -> int:
    # torch.compile's inductor reads its on-disk cache folder from the environment only; the
    # process is ours here, and spawned workers (tensor-parallel ranks, bench engines) inherit it
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_home() / "inductor"))
    out = Console(soft_wrap=True)
    try:
        return args.func(args, out)
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading (an OSError: first)
        # what stdout still buffers goes nowhere, rather than failing again as the process ends
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.stderr.close()
        return 0
    except (OSError, ValueError, TypeError) as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {escape(str(e))}")  # one line, unwrapped
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(entry())
