"""`nexttok serve` and `nexttok bench`."""

from __future__ import annotations

import argparse

from rich.console import Console

from nexttok.bundled import DEFAULT_MODEL
from nexttok.cli import common


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
    serve.add_argument("--dtype", default=None, help=common.DTYPE_HELP)
    serve.add_argument("--device", default=None)
    serve.add_argument("--compile", action="store_true", help=common.COMPILE_HELP)
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
    bench.add_argument("--dtype", default="auto", help=common.DTYPE_HELP)
    bench.add_argument("--no-compare", action="store_true", help="nexttok only")
    bench.add_argument("--compile", action="store_true", help="add a column with the decode step compiled")
    bench.set_defaults(func=cmd_bench)


def add_parsers(sub) -> None:
    _add_serve_parser(sub)
    _add_bench_parser(sub)
