"""Command-line front end. It calls the library and formats; nothing here computes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

from rich.console import Console
from rich.table import Table

from nexttok.bundled import DEFAULT_MODEL
from nexttok.sources import load_tokenizer
from nexttok.tokenizer import Piece

DTYPE_HELP = ("auto (default: a .gguf as shipped, quantized; a checkpoint directory in float32 on CPU), "
              "float32, bfloat16, float16, or int8 / int4 (linear layers quantized at load)")
COMPILE_HELP = "decode steps through torch.compile (needs g++): ~15% faster after a one-time compile (disk-cached)"
# llama.cpp's defaults for an interactive run; the library's SamplingParams defaults are neutral
CLI_SAMPLING = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.0)


def _visible(text: str) -> str:
    """Whitespace made visible for a table cell: _visible(" a\\n") == "␣a\\\\n"."""
    return text.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def _read_text(arg: str) -> str:
    """The argument, or standard input for "-" (which must be UTF-8)."""
    if arg != "-":
        return arg
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"standard input is not valid UTF-8 (byte {e.start}: {data[e.start:e.start + 1]!r})") from None


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


def _sampling_params(args: argparse.Namespace):
    from nexttok.sampling import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed)


def _model_and_prompt(args: argparse.Namespace) -> tuple[str, str]:
    if len(args.inputs) > 2:
        raise ValueError(f"expected [MODEL] PROMPT, got {len(args.inputs)} arguments (quote the prompt)")
    model = args.inputs[0] if len(args.inputs) == 2 else DEFAULT_MODEL
    return model, _read_text(args.inputs[-1])


def _load(model: str, args: argparse.Namespace):
    from nexttok.loading import load_checkpoint

    checkpoint = load_checkpoint(model, dtype=args.dtype, device=args.device, compile=args.compile)
    return checkpoint.model, checkpoint.tokenizer


def _step_record(step) -> dict:
    record = dataclasses.asdict(step)
    if record["stages"] is None:
        del record["stages"]
    return record


def cmd_run(args: argparse.Namespace, out: Console) -> int:
    from nexttok.generate import stream

    name, prompt = _model_and_prompt(args)
    params = _sampling_params(args)  # checked before the model loads
    model, tokenizer = _load(name, args)
    err = Console(stderr=True)
    steps = stream(model, tokenizer, prompt, params,
                   max_tokens=args.max_tokens, stop=args.stop, use_cache=not args.no_cache)
    prefill = decode = 0.0
    count, finish = 0, None
    for step in steps:
        if args.json:
            print(json.dumps(_step_record(step), ensure_ascii=False), flush=True)
        else:
            sys.stdout.write(step.text)
            sys.stdout.flush()
        prefill += step.elapsed if step.prefill else 0.0
        decode += 0.0 if step.prefill else step.elapsed
        count, finish = count + 1, step.finish_reason
    if not args.json:
        sys.stdout.write("\n")
        sys.stdout.flush()
    rate = f"{(count - 1) / decode:.1f} tokens/s" if decode > 0 else "n/a"
    err.print(f"[dim]{count} tokens ({finish}); first token {prefill * 1000:.0f} ms; decode {rate}"
              f"{' (no cache)' if args.no_cache else ''}[/]")
    return 0


def cmd_explain(args: argparse.Namespace, out: Console) -> int:
    from nexttok.generate import prompt_ids_for, stream

    if args.steps < 1 or args.top < 1:
        raise ValueError(f"--steps and --top must be >= 1, got {args.steps} and {args.top}")
    name, prompt = _model_and_prompt(args)
    params = _sampling_params(args)  # checked before the model loads
    model, tokenizer = _load(name, args)
    ids = prompt_ids_for(model, tokenizer, prompt)
    chips = " ".join(f"[reverse]{_escape(_visible(p.text))}[/][dim]{p.id}[/]" for p in tokenizer.pieces(ids))
    out.print(f"[bold]prompt[/] → {len(ids)} tokens: {chips}")
    steps = stream(model, tokenizer, ids, params, max_tokens=args.steps, stop=args.stop,
                   top_n=args.top, record_stages=True)
    text = ""
    for step in steps:
        out.print(_explain_table(step, prompt + text))
        text += step.text
    out.print(f"[bold]result:[/] {_escape(prompt)}[green]{_escape(text)}[/]")
    return 0


def _explain_table(step, text_so_far: str) -> Table:
    raw, final = step.stages[0], step.stages[-1]
    after = dict(zip(final.top_ids, final.top_probs, strict=True))
    fully_listed = final.kept <= len(final.top_ids)
    title = (f"step {step.index + 1}: after …{_escape(repr(text_so_far[-30:]))} — chose "
             f"{_escape(_visible(step.token_text))!r} (id {step.token_id}, rank {step.rank})")
    table = Table(title=title, title_justify="left", show_header=True, header_style="bold")
    for name, justify in (("rank", "right"), ("token", "left"), ("id", "right"), ("p", "right"),
                          ("", "left"), ("after sampler", "right")):
        table.add_column(name, justify=justify)
    for rank, alt in enumerate(step.top, 1):
        p = math.exp(alt.logprob)
        q = after.get(alt.id)
        shown = f"{q:.2%}" if q is not None else ("cut" if fully_listed else "<")
        style = "bold green" if alt.id == step.token_id else ""
        table.add_row(str(rank), _escape(_visible(alt.text)), str(alt.id), f"{p:.2%}",
                      "█" * round(p * 30), shown, style=style)
    other = 1 - sum(math.exp(a.logprob) for a in step.top)
    table.add_row("", "[dim]everything else[/]", "", f"{max(other, 0.0):.2%}", "", "")
    chain = " → ".join(f"{r.name} {r.kept}" for r in step.stages)
    draw = f"draw u={step.draw:.3f}" if step.draw is not None else "greedy"
    table.caption = (f"tokens kept: {chain}; entropy {raw.entropy:.2f} → {final.entropy:.2f} bits; "
                     f"{draw}; {step.elapsed * 1000:.0f} ms")
    table.caption_justify = "left"
    return table


def _add_generation_args(p: argparse.ArgumentParser, max_tokens: int | None) -> None:
    p.add_argument("inputs", nargs="+", metavar="[MODEL] PROMPT",
                   help="MODEL: a checkpoint directory, a .gguf file, a bundled model name or a hub id "
                   f"(default: the bundled {DEFAULT_MODEL}); PROMPT: the text ('-' reads standard input)")
    p.add_argument("--temperature", type=float, default=CLI_SAMPLING["temperature"],
                   help="0 = greedy (default %(default)s)")
    p.add_argument("--top-k", type=int, default=CLI_SAMPLING["top_k"], help="0 = off (default %(default)s)")
    p.add_argument("--top-p", type=float, default=CLI_SAMPLING["top_p"], help="(default %(default)s)")
    p.add_argument("--min-p", type=float, default=CLI_SAMPLING["min_p"], help="(default %(default)s)")
    p.add_argument("--repetition-penalty", type=float, default=CLI_SAMPLING["repetition_penalty"])
    p.add_argument("--seed", type=int, default=None, help="same seed, same tokens")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--dtype", default=None, help=DTYPE_HELP)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    if max_tokens is not None:
        p.add_argument("--max-tokens", type=int, default=max_tokens, help="(default %(default)s)")


def cmd_models(args: argparse.Namespace, out: Console) -> int:
    from nexttok import bundled

    table = Table(title="models available without a network", title_justify="left", header_style="bold")
    for column in ("name", "kind", "license", "where"):
        table.add_column(column)
    for name, model in bundled.BUNDLED_MODELS.items():
        try:
            where = str(bundled.bundled_model_file(name))
        except FileNotFoundError as e:
            where = f"[red]{_escape(str(e))}[/]"
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
    from nexttok.convert import convert_gguf
    from nexttok.sources import local_checkpoint

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


def cmd_serve(args: argparse.Namespace, out: Console) -> int:
    import os

    from nexttok.server import ServerLimits, create_app, load_served, serve_in_main_thread

    sources = args.models or [DEFAULT_MODEL]
    names = args.served_model_name or []
    if names and len(names) != len(sources):
        raise ValueError(f"--served-model-name given {len(names)} times for {len(sources)} models")
    err = Console(stderr=True)
    served = []
    for i, source in enumerate(sources):
        err.print(f"[dim]loading {source} ...[/]")
        served.append(load_served(source, names[i] if names else None, dtype=args.dtype, device=args.device,
                                  compile=args.compile))
    api_key = args.api_key or os.environ.get("NEXTTOK_API_KEY")
    limits = ServerLimits(max_running=args.max_running, max_queue=args.max_queue,
                          request_timeout=args.request_timeout or None, max_model_len=args.max_model_len or None,
                          batch_invariant=not args.no_batch_invariance, max_body_bytes=args.max_body_bytes)
    app = create_app(served, api_key=api_key, limits=limits, start_schedulers=False)
    err.print(f"serving {', '.join(m.name for m in served)} on http://{args.host}:{args.port} "
              f"({'API key required' if api_key else 'no API key'})")
    serve_in_main_thread(app, served, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def cmd_bench(args: argparse.Namespace, out: Console) -> int:
    import importlib.util

    from nexttok.benchmark import BenchConfig, run
    from nexttok.sources import resolve_checkpoint

    path = resolve_checkpoint(args.model or DEFAULT_MODEL)
    engines = ["nexttok", "compiled"] if args.compile else ["nexttok"]
    if not args.no_compare:
        if importlib.util.find_spec("transformers") is None:
            Console(stderr=True).print("[dim]transformers is not installed: nexttok column only[/]")
        else:
            engines.append("hf")
        engines.append("llama.cpp")  # reported as skipped, with the reason, when it cannot run
    cfg = BenchConfig(str(path), new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens,
                      repeat=args.repeat, threads=args.threads, dtype=args.dtype)
    for name, value in (("--new-tokens", cfg.new_tokens), ("--prompt-tokens", cfg.prompt_tokens),
                        ("--repeat", cfg.repeat), ("--threads", cfg.threads)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    Console(stderr=True).print(f"[dim]benchmarking {path} ({', '.join(engines)}) ...[/]")
    print(run(cfg, engines))
    return 0


def _add_serve_parser(sub) -> None:
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    serve.add_argument("models", nargs="*", metavar="MODEL",
                       help=f"models to serve (default: the bundled {DEFAULT_MODEL})")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' (also $NEXTTOK_API_KEY)")
    serve.add_argument("--served-model-name", action="append", help="name clients use (one per model)")
    serve.add_argument("--dtype", default=None, help=DTYPE_HELP)
    serve.add_argument("--device", default=None)
    serve.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    serve.add_argument("--max-running", type=int, default=8, help="requests decoded together (default 8)")
    serve.add_argument("--max-queue", type=int, default=64, help="waiting requests before 429 (default 64)")
    serve.add_argument("--request-timeout", type=float, default=600.0, help="seconds; 0 = none (default 600)")
    serve.add_argument("--max-body-bytes", type=int, default=4 << 20, help="larger request bodies get 413")
    serve.add_argument("--no-batch-invariance", action="store_true",
                       help="faster with few requests, but a request's tokens may then depend (in rare near-ties) "
                       "on what else runs in its batch")
    serve.add_argument("--max-model-len", type=int, default=4096,
                       help="prompt + completion tokens per request; 0 = the model's context (default 4096)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=cmd_serve)


def _add_bench_parser(sub) -> None:
    bench = sub.add_parser("bench", help="decode/prefill speed, side by side with HF transformers")
    bench.add_argument("model", nargs="?", default=None, help=f"checkpoint (default: {DEFAULT_MODEL})")
    bench.add_argument("--new-tokens", type=int, default=128)
    bench.add_argument("--prompt-tokens", type=int, default=512)
    bench.add_argument("--repeat", type=int, default=3)
    bench.add_argument("--threads", type=int, default=2)
    bench.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    bench.add_argument("--no-compare", action="store_true", help="nexttok only")
    bench.add_argument("--compile", action="store_true", help="add a column with the decode step compiled")
    bench.set_defaults(func=cmd_bench)


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

    run = sub.add_parser("run", help="generate text, streamed as it is made")
    _add_generation_args(run, max_tokens=128)
    run.add_argument("--json", action="store_true", help="one JSON object per generated token")
    run.add_argument("--no-cache", action="store_true",
                     help="recompute the whole context every step (shows what the KV cache saves)")
    run.set_defaults(func=cmd_run)

    explain = sub.add_parser("explain", help="show each step: the next-token table and the sampler")
    _add_generation_args(explain, max_tokens=None)
    explain.add_argument("--steps", type=int, default=5, help="tokens to explain (default %(default)s)")
    explain.add_argument("--top", type=int, default=10, help="rows per table (default %(default)s)")
    explain.set_defaults(func=cmd_explain)

    _add_serve_parser(sub)
    _add_bench_parser(sub)

    models = sub.add_parser("models", help="list the models and tokenizers available locally")
    models.set_defaults(func=cmd_models)

    convert = sub.add_parser("convert", help="write a GGUF model as an HF checkpoint directory (float32)")
    convert.add_argument("model", help=f".gguf file or bundled model name (default model: {DEFAULT_MODEL})")
    convert.add_argument("out", help="directory to write (config.json, model.safetensors, tokenizer files)")
    convert.set_defaults(func=cmd_convert)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Console(soft_wrap=True)
    try:
        return args.func(args, out)
    except (OSError, ValueError, TypeError) as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {_escape(str(e))}")  # one line, unwrapped
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
