"""`nexttok replay` and `nexttok diff`, and the --trace files `run` and `chat` write."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import time

from rich.console import Console
from rich.table import Table

from nexttok.cli import common

TOP_N = 5  # alternatives a trace keeps per step
FLIP_THRESHOLD = 0.05  # nats: a changed top-1 with a smaller margin is a near tie


def header(checkpoint, name: str, prompt_text: str | None, ids: list[int], params, *, max_tokens, stop,
           stop_token_ids, use_cache: bool = True, grammar: dict | None = None, speculative: dict | None = None
           ) -> dict:
    from nexttok.checkpoints.identity import checkpoint_sha256
    from nexttok.generation.trace import trace_header

    return trace_header(checkpoint.model, name=name, path=checkpoint.path, sha256=checkpoint_sha256(checkpoint.path),
                        prompt_text=prompt_text, prompt_ids=ids, params=params, max_tokens=max_tokens, stop=stop,
                        stop_token_ids=list(stop_token_ids), top_n=TOP_N, use_cache=use_cache, grammar=grammar,
                        speculative=speculative)


def writer(path: str, record: dict):
    from nexttok.generation.trace import TraceWriter

    return TraceWriter(path, record)


# -- replay --------------------------------------------------------------------------------------


def cmd_replay(args: argparse.Namespace, out: Console) -> int:
    from nexttok.checkpoints.identity import checkpoint_sha256
    from nexttok.checkpoints.loading import load_checkpoint
    from nexttok.generation.replay import replay
    from nexttok.generation.trace import read_trace

    trace = read_trace(args.trace)
    source = args.model or trace.header["model"]["path"]
    checkpoint = load_checkpoint(source, dtype=args.dtype, device=args.device, compile=args.compile)
    trace.check_model(checkpoint_sha256(checkpoint.path), str(source))
    result = replay(checkpoint.model, trace, _constraint(trace, checkpoint), one_pass=args.one_pass,
                    tokenizer=checkpoint.tokenizer)
    flips = result.flips(args.threshold)
    if args.json:
        for s in result.steps:
            print(json.dumps({"index": s.index, "id": s.token_id, "logprob_then": s.logprob_then,
                              "logprob_now": s.logprob_now, "top_then": s.top_then, "top_now": s.top_now,
                              "margin": s.margin, "kept": s.kept}))
    elif args.all or any(s.top_changed or not s.kept for s in result.steps):
        out.print(_replay_table(result, checkpoint.tokenizer, args.all))
    changed = [s for s in result.steps if s.top_changed]
    dropped = [s for s in result.steps if not s.kept]
    Console(stderr=True, soft_wrap=True).print(
        f"{len(result.steps)} steps replayed; largest logprob change {result.max_delta:.2e}; top-1 changed at "
        f"{len(changed)} (margin over {args.threshold}: {len(flips)}); outside the sampler's kept set: {len(dropped)}")
    return 1 if flips else 0


def _constraint(trace, checkpoint):
    grammar = trace.header["grammar"]
    if grammar is None:
        return None
    from nexttok.generation.grammar import Constraint

    config = checkpoint.model.config
    return Constraint.json_schema(checkpoint.tokenizer, config.vocab_size, grammar["schema"],
                                  trace.header["limits"]["stop_token_ids"])


def _replay_table(result, tokenizer, every: bool) -> Table:
    table = Table(show_header=True, header_style="bold")
    for name, justify in (("step", "right"), ("token", "left"), ("logprob then", "right"), ("now", "right"),
                          ("Δ", "right"), ("top-1 then → now", "left"), ("margin", "right"), ("kept", "left")):
        table.add_column(name, justify=justify)
    for s in result.steps:
        if not (every or s.top_changed or not s.kept):
            continue
        top = "same" if not s.top_changed else f"{_piece(tokenizer, s.top_then)} → {_piece(tokenizer, s.top_now)}"
        table.add_row(str(s.index), common.escape(common.visible(s.token_text)), f"{s.logprob_then:.4f}",
                      f"{s.logprob_now:.4f}", f"{s.delta:+.1e}", common.escape(top),
                      f"{s.margin:.3f}" if s.top_changed else "", "yes" if s.kept else "[red]no[/]")
    return table


def _piece(tokenizer, token_id: int | None) -> str:
    return "?" if token_id is None else repr(tokenizer.pieces([token_id])[0].text)


# -- diff ----------------------------------------------------------------------------------------


def cmd_diff(args: argparse.Namespace, out: Console) -> int:
    from nexttok.generation.diff import diff_traces
    from nexttok.generation.trace import read_trace

    if args.a is not None or args.b is not None:
        a, b = _live_pair(args)
    else:
        if len(args.inputs) != 2:
            raise ValueError("diff takes two trace files, or --a/--b settings with [MODEL] PROMPT")
        a, b = read_trace(args.inputs[0]), read_trace(args.inputs[1])
    d = diff_traces(a, b)
    for what, x, y in d.settings:
        out.print(f"[dim]{what}:[/] A {common.escape(_short(x))}  B {common.escape(_short(y))}")
    if d.identical:
        out.print(f"identical: the same {len(a.steps)} tokens")
        return 0
    v = d.divergence
    out.print(f"the same {v.index} tokens, then they part at step {v.index}:")
    for label, step, text in (("A", v.a, v.text_a), ("B", v.b, v.text_b)):
        if step is None:
            out.print(f"  {label}: (had ended)")
        else:
            out.print(f"  {label}: {common.escape(repr(step['token_text']))} p={_p(step):.4f} → "
                      f"{common.escape(repr(text))}")
    if v.gap is not None:
        out.print(f"gap p(A) - p(B) = {v.gap:+.4f}: " + ("a near tie" if v.near_tie else "not a near tie"))
    return 0


def _p(step: dict) -> float:
    return math.exp(step["logprob"])


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def _live_pair(args: argparse.Namespace):
    """Two runs of one model on one prompt, each with the run flags given in --a / --b."""
    from nexttok.generation.loop import prompt_ids_for, stream
    from nexttok.generation.trace import recorded

    base = _Flags(prog="nexttok diff --a/--b", add_help=False)
    common.add_generation_args(base, max_tokens=args.max_tokens)
    name, prompt = common.model_and_prompt(args)
    settings = [_settings(base, args, flags or "") for flags in (args.a, args.b)]
    checkpoint = common.load_checkpoint(name, args)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    ids = prompt_ids_for(model, tokenizer, prompt)
    traces = []
    for label, (params, stops, max_tokens) in zip("AB", settings, strict=True):
        start = time.perf_counter()
        steps = list(stream(model, tokenizer, ids, params, max_tokens=max_tokens, stop=stops, top_n=TOP_N))
        head = header(checkpoint, name, prompt, ids, params, max_tokens=max_tokens, stop=stops,
                      stop_token_ids=model.config.eos_token_id)
        traces.append(recorded(head, steps, time.perf_counter() - start, f"run {label}"))
    return traces


class _Flags(argparse.ArgumentParser):
    """The run flags of --a / --b: a bad one is a ValueError (one line), not argparse's exit."""

    def error(self, message: str):
        raise ValueError(message)


def _settings(base: argparse.ArgumentParser, args: argparse.Namespace, flags: str):
    try:
        parsed = base.parse_args([*shlex.split(flags), "prompt"])
    except ValueError as e:
        raise ValueError(f"--a/--b {flags!r}: {e}") from None
    return common.sampling_params(parsed), common.stop_strings(parsed), parsed.max_tokens


def add_parsers(sub) -> None:
    p = sub.add_parser("replay", help="force a trace's tokens through the model again and report what changed")
    p.add_argument("trace", help="a trace file (nexttok run --trace FILE)")
    p.add_argument("--model", default=None, help="the checkpoint to replay on (default: the one the trace names)")
    p.add_argument("--dtype", default=None, help=common.DTYPE_HELP)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--threshold", type=float, default=FLIP_THRESHOLD, metavar="NATS",
                   help="exit 1 when a step's top-1 changed with a margin above this (default %(default)s)")
    p.add_argument("--compile", action="store_true", help=common.COMPILE_HELP)
    p.add_argument("--one-pass", action="store_true",
                   help="score every step in one prefill (faster; rounds differently from the run's steps)")
    p.add_argument("--all", action="store_true", help="list every step, not only the ones that changed")
    p.add_argument("--json", action="store_true", help="one JSON object per step")
    p.set_defaults(func=cmd_replay)

    d = sub.add_parser("diff", help="two traces (or two settings on one prompt) side by side: where they part")
    d.add_argument("inputs", nargs="*", metavar="A B | [MODEL] PROMPT",
                   help="two trace files; or, with --a/--b, the model (default: the bundled one) and prompt")
    d.add_argument("--a", default=None, metavar="FLAGS", help='run flags of the first run, e.g. "--temperature 0"')
    d.add_argument("--b", default=None, metavar="FLAGS", help='run flags of the second run, e.g. "--temperature 1"')
    d.add_argument("--max-tokens", type=int, default=64, help="per live run, unless --a/--b say (default %(default)s)")
    d.add_argument("--dtype", default=None, help=common.DTYPE_HELP)
    d.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    d.add_argument("--compile", action="store_true", help=common.COMPILE_HELP)
    d.set_defaults(func=cmd_diff)
