"""`nexttok serve` and `nexttok bench`."""

from __future__ import annotations

import argparse

from rich.console import Console

from nexttok.checkpoints.bundled import DEFAULT_MODEL
from nexttok.cli import common


def cmd_serve(args: argparse.Namespace, out: Console) -> int:
    from nexttok.cli.client import host_and_port

    configured = host_and_port()  # $NEXTTOK_HOST, where `nexttok run` and `chat` look for this server
    args.host = args.host if args.host is not None else configured[0]
    args.port = args.port if args.port is not None else configured[1]
    sock = _listen(args.host, args.port)  # before anything slow: a bad or busy port fails at once
    try:
        return _serve(args, sock)
    finally:
        if sock is not None:
            sock.close()


def _listen(host: str, port: int):
    """The server's socket, bound to host:port before any model loads (then handed to uvicorn, so
    nothing can take the port in between). None on a torchrun rank other than 0: it never serves."""
    import os
    import socket

    if not 1 <= port <= 65535:
        raise ValueError(f"--port {port} is not a TCP port (1-65535)")
    if int(os.environ.get("RANK", "0") or 0) != 0:
        return None
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: not an address of this machine ({e.strerror})") from None
    # "localhost" may resolve to ::1 first: IPv4 then, where 127.0.0.1 clients look
    family, kind, proto, _, address = min(found, key=lambda entry: entry[0] != socket.AF_INET)
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ValueError(f"--port {port}: cannot listen on {host}:{port} ({e.strerror})") from None
    return sock


def _serve(args: argparse.Namespace, sock) -> int:
    import functools
    import os

    from nexttok.cli.pulling import ensure_pulled
    from nexttok.server import ServerLimits, create_app, load_served, serve_in_main_thread
    from nexttok.server.pool import keep_alive_seconds, stored_name

    sources = args.models or [DEFAULT_MODEL]
    names = args.served_model_name or []
    if names and len(names) != len(sources):
        raise ValueError(f"--served-model-name given {len(names)} times for {len(sources)} models")
    if args.tensor_parallel > 1 and len(sources) > 1:
        raise ValueError(f"--tensor-parallel serves one model, got {len(sources)}")
    if args.max_loaded < 1:
        raise ValueError(f"--max-loaded must be >= 1, got {args.max_loaded}")
    try:
        keep_alive = keep_alive_seconds(args.keep_alive)
    except ValueError as e:
        raise ValueError(f"--keep-alive: {e}") from None
    err = Console(stderr=True)
    served = []
    for i, source in enumerate(sources):
        ensure_pulled(source)
        err.print(f"[dim]loading {source} ...[/]")
        name = names[i] if names else _stored_name(source)
        served.append(_load_parallel(source, name, args) if args.tensor_parallel != 1 else
                      load_served(source, name, dtype=args.dtype, device=args.device, compile=args.compile))
    api_key = args.api_key or os.environ.get("NEXTTOK_API_KEY")
    limits = ServerLimits(max_running=args.max_running, max_queue=args.max_queue,
                          request_timeout=args.request_timeout or None, max_model_len=args.max_model_len or None,
                          batch_invariant=not args.no_batch_invariance, max_body_bytes=args.max_body_bytes,
                          prefix_cache_tokens=0 if args.tensor_parallel != 1 else args.prefix_cache_tokens,
                          keep_alive=keep_alive, max_loaded=args.max_loaded)
    loader = functools.partial(load_served, dtype=args.dtype, device=args.device, compile=args.compile)
    app = create_app(served, api_key=api_key, limits=limits, start_schedulers=False, loader=loader,
                     loadable=_refuse_all if args.tensor_parallel != 1 else stored_name)
    group = _attach_parallel(served[0]) if args.tensor_parallel != 1 else None
    if group is not None:
        err.print("[dim]tensor parallel: the prefix cache is off (each rank would need a pool of its own)[/]")
    err.print(f"serving {', '.join(m.name for m in served)} on http://{args.host}:{args.port} "
              f"({'API key required' if api_key else 'no API key'})")
    try:
        serve_in_main_thread(app, served, host=args.host, port=args.port, log_level=args.log_level, sock=sock)
    finally:
        if group is not None:
            group.close()
    if group is not None:
        group.check()  # a lost rank ended the server: say so (one line) and exit non-zero
    return 0


def _stored_name(source: str) -> str | None:
    """A stored model is served under its stored name (hf.co/Org/Repo:Q4_K_M for org/repo:q4_k_m),
    the name a request for any of its spellings finds; None for anything else (its name as given)."""
    from pathlib import Path

    from nexttok.checkpoints import store

    manifest = None if Path(source).exists() else store.find(source)
    return manifest.name if manifest is not None else None


def _refuse_all(name: str) -> None:
    """With --tensor-parallel the server runs its one model: nothing loads on demand."""
    return None


def _load_parallel(source: str, name: str | None, args: argparse.Namespace):
    """A model split over --tensor-parallel ranks, ready to serve (rank 0; the others follow inside)."""
    from pathlib import Path

    from nexttok.parallel.model import load_parallel
    from nexttok.server import ServedModel

    checkpoint = load_parallel(source, world=args.tensor_parallel, dtype=args.dtype, device=args.device,
                               compile=args.compile, timeout=args.tp_timeout)
    default_name = Path(source).name if Path(source).exists() else str(source)
    return ServedModel(name or default_name, checkpoint.model, checkpoint.tokenizer, checkpoint.chat_template,
                       path=checkpoint.path)


def _attach_parallel(served):
    """Keep the scheduler's KV cache in step on every rank (its claims and releases replayed there),
    and stop the server when a rank is lost: open requests end with the reason."""
    import threading

    model, scheduler = served.model, served.scheduler
    scheduler.cache = model.mirrored(scheduler.cache)
    model.group.on_failure(lambda: threading.Thread(target=scheduler.stop, args=(model.group.failure,),
                                                    daemon=True).start())
    return model.group


def cmd_bench(args: argparse.Namespace, out: Console) -> int:
    import importlib.util
    import os

    from nexttok.bench_native import compare, llama_cpp_bin
    from nexttok.benchmark import BenchConfig, run
    from nexttok.checkpoints.sources import resolve_checkpoint

    if args.tensor_parallel != 1 and "RANK" in os.environ:
        raise ValueError("bench --tensor-parallel starts its own ranks: run it without torchrun")
    path = resolve_checkpoint(args.model or DEFAULT_MODEL)
    if args.streams is not None:
        return _bench_streams(args, str(path))
    args.rounds = 5 if args.rounds is None else args.rounds
    engines = ["nexttok", "compiled"] if args.compile else ["nexttok"]
    native = None if args.no_compare or path.suffix != ".gguf" else llama_cpp_bin(args.llama_cpp_bin)
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if not args.no_compare:
        if importlib.util.find_spec("transformers") is None:
            Console(stderr=True).print("[dim]transformers is not installed: nexttok column only[/]")
        else:
            engines.append("hf")
        if native is None:  # reported as skipped, with the reason, when it cannot run
            engines.append("llama.cpp")
    cfg = BenchConfig(str(path), new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens,
                      repeat=args.repeat, threads=args.threads, dtype=args.dtype, tensor_parallel=args.tensor_parallel)
    for name, value in (("--new-tokens", cfg.new_tokens), ("--prompt-tokens", cfg.prompt_tokens),
                        ("--repeat", cfg.repeat), ("--threads", cfg.threads),
                        ("--tensor-parallel", cfg.tensor_parallel)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    Console(stderr=True).print(f"[dim]benchmarking {path} ({', '.join(engines)}) ...[/]")
    print(run(cfg, engines))
    if native is not None:
        print(f"\nllama.cpp: its own llama-bench ({native}), not llama-cpp-python")
        print(compare(str(path), native, threads=cfg.threads, prompt=cfg.prompt_tokens, new=cfg.new_tokens,
                      rounds=args.rounds))
    elif "llama.cpp" in engines:
        print("llama.cpp: through llama-cpp-python (its Python generate loop), since no llama-bench was found: "
              "--llama-cpp-bin DIR or $NEXTTOK_LLAMA_CPP_BIN names a build (../shared/tools/build-llama-cpp.sh)")
    return 0


def _bench_streams(args: argparse.Namespace, model: str) -> int:
    """--streams: nexttok serve against llama-server -np N, N concurrent streams (bench_streams)."""
    import signal

    from nexttok.bench_streams import Spec, llama_server, parse_streams, report, run_streams

    streams = parse_streams(args.streams)
    if args.compile or args.tensor_parallel != 1:
        raise ValueError("--streams measures `nexttok serve` as it runs by default: not with --compile or "
                         "--tensor-parallel")
    rounds = 3 if args.rounds is None else args.rounds
    for name, value in (("--rounds", rounds), ("--threads", args.threads), ("--new-tokens", args.new_tokens)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    err = Console(stderr=True, soft_wrap=True)  # rows of the table: never wrapped
    binary, why = (None, "--no-compare") if args.no_compare else llama_server(args.llama_cpp_bin)
    if binary is not None and not model.endswith(".gguf"):
        binary, why = None, f"{model} is not a .gguf file"
    if binary is None:
        err.print(f"[dim]llama-server: not run ({why}); nexttok serve only[/]")
    spec = Spec(model, binary, threads=args.threads, rounds=rounds, max_tokens=args.new_tokens)
    err.print(f"[dim]streams {', '.join(map(str, streams))}: {' and '.join(spec.engines)}, {rounds} round(s); "
              "server logs in /tmp/streams-*.log[/]")
    def progress(n, got) -> None:  # each N's rows as it ends: a long run shows what it has
        err.print(common.escape("\n".join(report(spec, {n: got}).splitlines()[2:])), style="dim")

    def terminate(signum, frame):  # the servers run in sessions of their own: stop them on a kill too
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        print(run_streams(spec, streams, on_result=progress))
    except RuntimeError as e:  # a server that would not start or a stream that failed: one line
        err.print(f"[red]error:[/] {common.escape(str(e))}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _add_serve_parser(sub) -> None:
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    serve.add_argument("models", nargs="*", metavar="MODEL",
                       help=f"models to serve (default: the bundled {DEFAULT_MODEL})")
    serve.add_argument("--host", default=None, help="bind address (default: $NEXTTOK_HOST's, else 127.0.0.1: "
                       "loopback only)")
    serve.add_argument("--port", type=int, default=None, help="(default: $NEXTTOK_HOST's, else 8000)")
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
    serve.add_argument("--prefix-cache-tokens", type=int, default=8192,
                       help="keys and values of recent prompts kept per model, so a prompt that begins as an "
                       "earlier one did (the next turn of a chat) skips prefilling that part; the tokens "
                       "generated are the same either way (a model with recurrent layers also keeps checkpoints "
                       "of their states, each counted as the tokens of as many bytes); 0 = off (default 8192)")
    serve.add_argument("--max-model-len", type=int, default=4096,
                       help="prompt + completion tokens per request; 0 = the model's context (default 4096)")
    serve.add_argument("--keep-alive", default="5m", metavar="DURATION",
                       help="how long a model loaded on first use stays once idle: seconds or a duration "
                       "(\"5m\", \"1h30m\"); negative: forever; a request's keep_alive overrides it (default 5m; "
                       "the MODELs named here stay)")
    serve.add_argument("--max-loaded", type=int, default=3, metavar="N",
                       help="models loaded on first use kept at once; past it the least recently used idle one is "
                       "unloaded (default 3; the MODELs named here not counted)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    common.add_parallel_args(serve)
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
    bench.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                       help="the nexttok column with the model split over N local processes")
    bench.add_argument("--llama-cpp-bin", default=None, metavar="DIR",
                       help="llama.cpp's own tools to compare a .gguf against (llama-bench; default: "
                       "$NEXTTOK_LLAMA_CPP_BIN, else ../shared/tools/build-llama-cpp.sh's cached build)")
    bench.add_argument("--rounds", type=int, default=None,
                       help="rounds against llama.cpp, alternating which engine runs first (default 5 against "
                       "llama-bench, 3 with --streams)")
    bench.add_argument("--streams", default=None, metavar="N,N,...",
                       help="throughput under load instead: nexttok serve against llama-server -np N, N concurrent "
                       "streaming requests (e.g. 1,4,8); aggregate tokens/s and time to first token p50/p95; "
                       "--new-tokens is each request's max_tokens")
    bench.set_defaults(func=cmd_bench)


def add_parsers(sub) -> None:
    _add_serve_parser(sub)
    _add_bench_parser(sub)
