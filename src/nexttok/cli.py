"""Command-line front end. It calls the library and formats; nothing here computes."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from nexttok.tokenizer import Piece, load_tokenizer


def _visible(text: str) -> str:
    """Whitespace made visible for a table cell: _visible(" a\\n") == "␣a\\\\n"."""
    return text.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def _read_text(arg: str) -> str:
    return sys.stdin.read() if arg == "-" else arg


def cmd_tokenize(args: argparse.Namespace, out: Console) -> int:
    tokenizer = load_tokenizer(args.model)
    text = _read_text(args.text)
    ids = tokenizer.encode(text, allow_special=not args.no_special, add_special=args.add_special)
    pieces = tokenizer.pieces(ids)
    if args.json:
        record = {
            "ids": ids,
            "pieces": [p.text for p in pieces],
            "count": len(ids),
            "chars": len(text),
            "bytes": len(text.encode("utf-8")),
        }
        print(json.dumps(record, ensure_ascii=False))
        return 0
    out.print(_pieces_table(pieces, tokenizer.special_ids))
    out.print(f"[bold]{len(ids)}[/] tokens for {len(text)} characters ({len(text.encode())} bytes)")
    return 0


def _pieces_table(pieces: list[Piece], special_ids: frozenset[int]) -> Table:
    table = Table(show_header=True, header_style="bold")
    table.add_column("#", justify="right", style="dim")
    table.add_column("id", justify="right", style="cyan")
    table.add_column("piece")
    table.add_column("bytes", style="dim")
    for n, piece in enumerate(pieces):
        style = "magenta" if piece.id in special_ids else ""
        table.add_row(str(n), str(piece.id), f"[{style}]{_escape(_visible(piece.text))}[/]"
                      if style else _escape(_visible(piece.text)), piece.bytes.hex(" "))
    return table


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nexttok", description="See how a language model makes text.")
    sub = parser.add_subparsers(dest="command", required=True)
    tok = sub.add_parser("tokenize", help="split text into tokens and show their ids")
    tok.add_argument("model", help="model directory, tokenizer.json, bundled name (gpt2) or hub id")
    tok.add_argument("text", help="text to tokenize ('-' reads standard input)")
    tok.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    tok.add_argument("--no-special", action="store_true",
                     help="treat special tokens written in the text as plain text")
    tok.add_argument("--add-special", action="store_true",
                     help="add the BOS/EOS tokens the tokenizer's post-processor defines")
    tok.set_defaults(func=cmd_tokenize)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Console(soft_wrap=True)
    try:
        return args.func(args, out)
    except (OSError, ValueError, TypeError) as e:
        Console(stderr=True).print(f"[red]error:[/] {_escape(str(e))}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
