"""`nexttok models` and `nexttok convert`."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from nexttok.checkpoints.bundled import DEFAULT_MODEL
from nexttok.cli import common


def cmd_models(args: argparse.Namespace, out: Console) -> int:
    from nexttok.checkpoints import bundled

    table = Table(title="models available without a network", title_justify="left", header_style="bold")
    for column in ("name", "kind", "license", "where"):
        table.add_column(column)
    for name, model in bundled.BUNDLED_MODELS.items():
        try:  # where it is, never joined here: a listing writes nothing
            path, there = bundled.bundled_model_place(name)
            where = common.escape(str(path)) if there else \
                f"{common.escape(str(path))} [dim](joined from its parts on first use)[/]"
        except FileNotFoundError as e:
            where = f"[red]{common.escape(str(e))}[/]"
        label = f"{name} (default)" if name == DEFAULT_MODEL else name
        table.add_row(label, "model, bundled", model.license, where)
    for name in bundled.BUNDLED_TOKENIZERS:
        directory = bundled.tokenizer_dir(name)
        table.add_row(name, "tokenizer, bundled", "MIT", str(directory) if directory else "[red]missing[/]")
    for repo, path in _hf_cached_checkpoints():
        table.add_row(repo, "model, HF cache", "see its model card", str(path))
    out.print(table)
    return 0


def cmd_convert(args: argparse.Namespace, out: Console) -> int:
    from nexttok.checkpoints.convert import convert_gguf
    from nexttok.checkpoints.sources import local_checkpoint

    found = local_checkpoint(args.model, missing="GGUF file")
    if found is None or not found.is_file():
        raise ValueError(f"{args.model} is not a .gguf file or a bundled model name")
    target = convert_gguf(found, args.out)
    out.print(f"wrote {target} (float32 safetensors, tokenizer.json, tokenizer_config.json)")
    return 0


def _hf_cached_checkpoints() -> list[tuple[str, str]]:
    """Model repos in the Hugging Face cache with a config.json and safetensors weights."""
    try:
        from huggingface_hub import scan_cache_dir

        info = scan_cache_dir()
    except Exception:  # no cache yet, or an unreadable one: nothing to list
        return []
    found = []
    for repo in info.repos:
        for revision in repo.revisions:
            files = {f.file_name for f in revision.files}
            if "config.json" in files and any(n.endswith(".safetensors") for n in files):
                found.append((repo.repo_id, str(revision.snapshot_path)))
                break
    return found


def add_parsers(sub) -> None:
    models = sub.add_parser("models", help="list the models and tokenizers available locally")
    models.set_defaults(func=cmd_models)
    convert = sub.add_parser("convert", help="write a GGUF model as an HF checkpoint directory (float32)")
    convert.add_argument("model", help=f".gguf file or bundled model name (default model: {DEFAULT_MODEL})")
    convert.add_argument("out", help="directory to write (config.json, model.safetensors, tokenizer files)")
    convert.set_defaults(func=cmd_convert)
