"""`nexttok tokenize` and `nexttok run`."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys

from rich.console import Console
from rich.table import Table

from nexttok.checkpoints.sources import load_tokenizer
from nexttok.cli import common, traces
from nexttok.generation.parameters import DRAFT_TOKENS_BOUND
from nexttok.tokenizers.tokenizer import Piece


def cmd_tokenize(args: argparse.Namespace, out: Console) -> int:
    tokenizer = load_tokenizer(args.model)
    text = common.read_text(args.text)
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
        table.add_row(str(n), str(piece.id), f"[{style}]{common.escape(common.visible(piece.text))}[/]"
                      if style else common.escape(common.visible(piece.text)), piece.bytes.hex(" "))
    return table


def _step_record(step) -> dict:
    record = dataclasses.asdict(step)
    if record["stages"] is None:
        del record["stages"]
    return record


IN_PROCESS_ONLY = {"--json": False, "--speculative": None, "--no-cache": False, "--tensor-parallel": 1,
                   "--compile": False, "--dtype": None, "--device": None}


def cmd_run(args: argparse.Namespace, out: Console) -> int:
    from nexttok.cli import remote
    from nexttok.cli.pulling import ensure_pulled

    name, prompt = common.model_and_prompt(args)
    params = common.sampling_params(args)  # checked before the model loads
    stops = common.stop_strings(args)
    schema = _output_schema(args)
    if args.speculative and args.no_cache:
        raise ValueError("--speculative verifies drafts through the KV cache: drop --no-cache")
    _check_draft_tokens(args)
    ensure_pulled(name)
    needs_here = remote.in_process_only(args, IN_PROCESS_ONLY)
    if needs_here is None and len(stops) > remote.MAX_STOP:
        needs_here = f"more than {remote.MAX_STOP} --stop"
    use_server, line = remote.where(args, name, needs_here)
    err = Console(stderr=True, soft_wrap=True)
    if use_server:
        try:
            return _run_on_server(remote.ServerModel(name), prompt, args, remote.sampling_of(params), stops, schema,
                                  line, err)
        except remote.ServerError as e:
            if e.status != 404:
                raise
            line = remote.fallback_line(name, e)
    return _run_here(name, prompt, args, params, stops, schema, line)


def _run_on_server(model, prompt: str, args, sampling: dict, stops, schema, line: str, err: Console) -> int:
    """The run through the server: the dim line once it answers (a 404 before: ServerError, and the
    run goes on here), the text as it comes, the same summary line."""
    from nexttok.cli import remote

    said = []

    def write(text: str) -> None:
        if not said:
            err.print(f"[dim]{common.escape(line)}[/]")
            said.append(True)
        sys.stdout.write(text)
        sys.stdout.flush()

    done = remote.run(model, prompt, args, sampling, stops, schema, write)
    if not said:
        write("")
    sys.stdout.write("\n")
    sys.stdout.flush()
    rate = f"{(done.count - 1) / done.decode:.1f} tokens/s" if done.decode > 0 and done.count > 1 else "n/a"
    err.print(f"[dim]{done.count} tokens ({done.finish}); first token {done.first * 1000:.0f} ms (from the request); "
              f"decode {rate}[/]")
    return 0


def _run_here(name: str, prompt: str, args: argparse.Namespace, params, stops, schema, line: str) -> int:
    """The run in this process; line (which way it went) is said once the first token is out: an
    error before that is the one line on stderr, as it always was."""
    from nexttok.generation.trace import grammar_record

    checkpoint = common.load_checkpoint(name, args)
    err = Console(stderr=True, soft_wrap=True)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    ids = _prompt_ids(model, tokenizer, prompt)
    common.note_context_cut("--max-tokens", args.max_tokens, model, ids)
    drafter = _drafter(args, checkpoint)
    speculative = {"drafter": drafter.name, "draft_tokens": args.draft_tokens} if drafter else None
    trace = traces.writer(args.trace, traces.header(
        checkpoint, name, prompt, ids, params, max_tokens=args.max_tokens, stop=stops,
        stop_token_ids=model.config.eos_token_id, use_cache=not args.no_cache,
        grammar=grammar_record(schema), speculative=speculative)) if args.trace else None
    rounds = _rounds() if drafter else None
    steps = _steps(args, checkpoint, ids, params, stops, _constraint(args, checkpoint, schema), drafter, rounds)
    try:
        said = functools.partial(err.print, f"[dim]{common.escape(line)}[/]")
        count, finish, prefill, decode, generated = _print_steps(args, steps, trace, said)
    finally:
        if trace is not None:
            trace.close()
    rate = f"{(count - 1) / decode:.1f} tokens/s" if decode > 0 else "n/a"
    err.print(f"[dim]{count} tokens ({finish}); first token {prefill * 1000:.0f} ms; decode {rate}"
              f"{' (no cache)' if args.no_cache else ''}[/]")
    if rounds is not None:
        err.print(f"[dim]speculative ({drafter.name}): {rounds.accepted} of {rounds.drafted} drafted tokens "
                  f"accepted ({100 * rounds.acceptance:.0f}%); {rounds.tokens_per_forward:.2f} tokens per "
                  f"forward pass of the model[/]")
        if decode > 0:
            err.print(f"[dim]{_speed_up(checkpoint, args, ids, generated, params, (count - 1) / decode)}[/]")
    return 0


PLAIN_STEPS = 8  # plain decode steps timed for --speculative's speed-up


def _speed_up(checkpoint, args, ids: list[int], generated: list[int], params, rate: float) -> str:
    """The speculative run's decode rate against plain decoding's, measured now: PLAIN_STEPS
    single-token steps (same sampler, same model) from the run's midpoint, where its context
    stood on average."""
    from nexttok.generation.loop import context_window, generate

    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    context = ids + generated[:len(generated) // 2]
    n = min(PLAIN_STEPS, context_window(model.config) - len(context) - 1)
    if n < 1:
        return "speed-up: not measured (no room in the context window for plain steps)"
    steps = generate(model, tokenizer, context, params, max_tokens=n + 1, stop_token_ids=[], **_scores(args)).steps
    plain = sum(s.elapsed for s in steps[1:])
    if len(steps) < 2 or plain <= 0:
        return "speed-up: not measured (plain decoding stopped at once)"
    plain_rate = (len(steps) - 1) / plain
    return (f"speed-up {rate / plain_rate:.2f}x over plain decoding ({plain_rate:.1f} tokens/s: "
            f"{len(steps) - 1} steps timed from token {len(context)})")


def _prompt_ids(model, tokenizer, prompt: str) -> list[int]:
    from nexttok.generation.loop import prompt_ids_for

    return prompt_ids_for(model, tokenizer, prompt)


def _rounds():
    from nexttok.generation.speculative import Rounds

    return Rounds()


def _constraint(args: argparse.Namespace, checkpoint, schema: dict | None):
    if schema is None:
        return None
    from nexttok.generation.grammar import Constraint

    config = checkpoint.model.config
    return Constraint.json_schema(checkpoint.tokenizer, config.vocab_size, schema, config.eos_token_id,
                                  "--json-schema" if args.json_schema else "--format")


def _check_draft_tokens(args: argparse.Namespace) -> None:
    """--draft-tokens within its bound, checked before the model loads."""
    if not DRAFT_TOKENS_BOUND.allows(args.draft_tokens):
        raise ValueError(f"--draft-tokens must be {DRAFT_TOKENS_BOUND.allowed()}, got {args.draft_tokens}")


def _drafter(args: argparse.Namespace, checkpoint):
    """--speculative ngram (prompt lookup) or a draft model of the same tokenizer; None without it."""
    if not args.speculative:
        return None
    from nexttok.generation.speculative import ModelDrafter, NgramDrafter, check_rollback

    check_rollback(checkpoint.model.config)
    if args.speculative == "ngram":
        return NgramDrafter()
    draft = common.load_checkpoint(args.speculative, argparse.Namespace(**{**vars(args), "tensor_parallel": 1}))
    if draft.tokenizer.vocab != checkpoint.tokenizer.vocab or draft.model.config.vocab_size > \
            checkpoint.model.config.vocab_size:
        raise ValueError(f"--speculative {args.speculative}: its tokenizer is not the model's (a draft model "
                         "must share the tokenizer)")
    return ModelDrafter(draft.model, args.speculative)


def _scores(args: argparse.Namespace) -> dict:
    """What each Step computes beyond its token and text: the logprob, rank and top alternatives
    only where something shows them (--trace, --json); a plain run is the sampler chain alone."""
    wanted = bool(args.trace or args.json)
    return {"top_n": traces.TOP_N if wanted else 0, "logprobs": wanted}


def _steps(args, checkpoint, ids, params, stops, constraint, drafter, rounds):
    from nexttok.generation.loop import stream

    options = dict(max_tokens=args.max_tokens, stop=stops, constraint=constraint, **_scores(args))
    if drafter is None:
        return stream(checkpoint.model, checkpoint.tokenizer, ids, params, use_cache=not args.no_cache, **options)
    from nexttok.generation.speculative import speculative_stream

    return speculative_stream(checkpoint.model, checkpoint.tokenizer, ids, params, drafter, k=args.draft_tokens,
                              rounds=rounds, **options)


def _print_steps(args: argparse.Namespace, steps, trace, first=None) -> tuple[int, str | None, float, float,
                                                                             list[int]]:
    """Each step's text (or JSON record) as it comes, into the trace too: (tokens, finish reason,
    prefill seconds, decode seconds, the token ids). first() is called before the first step."""
    prefill = decode = 0.0
    count, finish, generated = 0, None, []
    for step in steps:
        if first is not None and count == 0:
            first()
        if trace is not None:
            trace.step(step)
        if args.json:
            print(json.dumps(_step_record(step), ensure_ascii=False), flush=True)
        else:
            sys.stdout.write(step.text)
            sys.stdout.flush()
        prefill += step.elapsed if step.prefill else 0.0
        decode += 0.0 if step.prefill else step.elapsed
        count, finish = count + 1, step.finish_reason
        generated.append(step.token_id)
    if not args.json:
        sys.stdout.write("\n")
        sys.stdout.flush()
    return count, finish, prefill, decode, generated


def _output_schema(args: argparse.Namespace) -> dict | None:
    """The JSON schema the output must follow: --json-schema FILE, --format json (any object), or None."""
    from nexttok.generation.grammar import MAX_SCHEMA_DEPTH, json_depth

    if args.json_schema and args.format:
        raise ValueError("give --json-schema or --format, not both")
    if args.format:
        return {"type": "object"}
    if not args.json_schema:
        return None
    too_deep = ValueError(f"--json-schema {args.json_schema}: the schema is nested more than {MAX_SCHEMA_DEPTH} "
                          f"levels deep (objects and arrays); the limit is {MAX_SCHEMA_DEPTH}")
    try:
        with open(args.json_schema, encoding="utf-8") as f:
            schema = json.load(f)
    except OSError as e:
        raise ValueError(f"--json-schema {args.json_schema}: cannot read it ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"--json-schema {args.json_schema}: not valid JSON ({e})") from None
    except RecursionError:  # nested deeper than Python's reader goes: far past the limit
        raise too_deep from None
    if not isinstance(schema, dict):
        raise ValueError(f"--json-schema {args.json_schema}: a JSON schema must be an object")
    if json_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise too_deep
    return schema


def add_parsers(sub) -> None:
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
    common.add_generation_args(run, max_tokens=128)
    run.add_argument("--json", action="store_true", help="one JSON object per generated token")
    run.add_argument("--json-schema", metavar="FILE", default=None,
                     help="constrain the output to JSON that validates against this schema (a grammar stage)")
    run.add_argument("--format", choices=["json"], default=None,
                     help="json: constrain the output to a JSON object (as `ollama run --format json`)")
    run.add_argument("--speculative", metavar="ngram|MODEL", default=None,
                     help="speculative decoding: draft by prompt lookup (ngram) or with a small model of the "
                     "same tokenizer, verify each round in one forward pass")
    run.add_argument("--draft-tokens", type=int, default=DRAFT_TOKENS_BOUND.default, metavar="K",
                     help=f"with --speculative: tokens drafted per round, {DRAFT_TOKENS_BOUND.allowed()} "
                     "(default %(default)s)")
    run.add_argument("--trace", metavar="FILE", default=None,
                     help="record the generation as a trace (JSON Lines): nexttok replay / diff read it")
    run.add_argument("--no-cache", action="store_true",
                     help="recompute the whole context every step (shows what the KV cache saves)")
    run.add_argument("--no-server", action="store_true",
                     help="load the model in this process even when a nexttok server answers at $NEXTTOK_HOST")
    common.add_parallel_args(run)
    run.set_defaults(func=cmd_run)
