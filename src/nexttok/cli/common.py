"""What the commands share: reading a prompt, loading a model, sampling options, display helpers."""

from __future__ import annotations

import argparse
import sys

from nexttok.checkpoints.bundled import DEFAULT_MODEL
from nexttok.generation.parameters import LLAMA_CPP_SAMPLING

DTYPE_HELP = ("auto (default: a .gguf as shipped, quantized; a checkpoint directory in float32 on CPU), "
              "float32, bfloat16, float16, or int8 / int4 (linear layers quantized at load)")
COMPILE_HELP = "decode steps through torch.compile (needs g++): ~15%% faster after a one-time compile (disk-cached)"
# llama.cpp's defaults for an interactive run; the library's SamplingParams defaults are neutral
CLI_SAMPLING = {**LLAMA_CPP_SAMPLING, "repetition_penalty": 1.0}


def visible(text: str) -> str:
    """Whitespace made visible for a table cell: visible(" a\\n") == "␣a\\\\n"."""
    return text.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def read_text(arg: str) -> str:
    """The argument, or standard input for "-" (which must be UTF-8)."""
    if arg != "-":
        return arg
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"standard input is not valid UTF-8 (byte {e.start}: {data[e.start:e.start + 1]!r})") from None


def escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def sampling_params(args: argparse.Namespace):
    from nexttok.generation.sampling import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed)


def stop_strings(args: argparse.Namespace) -> list[str]:
    """--stop's values, checked before the model loads: an empty one would stop nothing."""
    if "" in args.stop:
        raise ValueError('--stop "": a stop string must not be empty')
    return args.stop


def model_and_prompt(args: argparse.Namespace) -> tuple[str, str]:
    if len(args.inputs) > 2:
        raise ValueError(f"expected [MODEL] PROMPT, got {len(args.inputs)} arguments (quote the prompt)")
    model = args.inputs[0] if len(args.inputs) == 2 else DEFAULT_MODEL
    return model, read_text(args.inputs[-1])


def load(model: str, args: argparse.Namespace):
    """Model and tokenizer (of load_checkpoint)."""
    checkpoint = load_checkpoint(model, args)
    return checkpoint.model, checkpoint.tokenizer


def load_checkpoint(model: str, args: argparse.Namespace):
    """The checkpoint; with --tensor-parallel N > 1 the model is split over N ranks (rank 0
    returns; any other rank, under torchrun, follows rank 0 and exits inside this call). A hub name
    not pulled yet (hf.co/ORG/REPO:QUANT) is pulled first."""
    from nexttok.cli.pulling import ensure_pulled

    ensure_pulled(model)
    if getattr(args, "tensor_parallel", 1) != 1:  # load_parallel checks N
        from nexttok.parallel.model import load_parallel

        return load_parallel(model, world=args.tensor_parallel, dtype=args.dtype, device=args.device,
                             compile=args.compile, timeout=args.tp_timeout)
    from nexttok.checkpoints.loading import load_checkpoint as load_one

    return load_one(model, dtype=args.dtype, device=args.device, compile=args.compile)


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="split the model over N processes (started here; under torchrun, its processes)")
    p.add_argument("--tp-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="with --tensor-parallel: how long a rank waits for the others before the run "
                   "ends with an error (default %(default)s)")


def add_generation_args(p: argparse.ArgumentParser, max_tokens: int | None) -> None:
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
