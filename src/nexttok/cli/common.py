"""What the commands share: reading a prompt, loading a model, sampling options, display helpers."""

from __future__ import annotations

import argparse
import sys

from nexttok.checkpoints.bundled import DEFAULT_MODEL
from nexttok.errors import InvalidParameter
from nexttok.generation.parameters import LLAMA_CPP_SAMPLING, STOP_STRINGS_BOUND
from nexttok.generation.stages import SETTINGS, Bound, Strings

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
    """SamplingParams of the sampling flags (add_sampling_args), checked: a bad value is one line
    naming the setting."""
    from nexttok.generation.sampling import SamplingParams

    values = {}
    for name, setting in SETTINGS.items():
        value = getattr(args, name)
        if isinstance(setting, Strings):
            value = setting.fresh() if value is None else [] if value == ["none"] else value
        elif not isinstance(setting, Bound):
            value = dict(_bias(item) for item in value or [])
        values[name] = value
    return SamplingParams(**values, seed=args.seed)


def _bias(text: str) -> tuple[int, float]:
    """--logit-bias ID=BIAS: _bias("50256=-100") == (50256, -100.0)."""
    token, _, bias = text.partition("=")
    try:
        return int(token), float(bias)
    except ValueError:
        raise InvalidParameter("logit_bias", f"--logit-bias takes ID=BIAS (e.g. 50256=-100), got {text!r}") from None


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """A flag for every setting of every sampler stage (nexttok.generation.stages), `run`'s and
    `chat`'s alike: --top-k, --dry-multiplier, ...; defaults are llama.cpp's for an interactive run
    where it has one of the first filters (CLI_SAMPLING), else the library's neutral ones."""
    group = p.add_argument_group("sampling (each stage's settings; nexttok explain's page shows what each does)")
    for name, setting in SETTINGS.items():
        meaning = setting.meaning.replace("%", "%%")
        if isinstance(setting, Bound):
            group.add_argument(f"--{name.replace('_', '-')}", dest=name, type=setting.annotation,
                               default=CLI_SAMPLING.get(name, setting.default), help=f"{meaning} (default %(default)s)")
        elif isinstance(setting, Strings):
            group.add_argument(f"--{setting.flag}", dest=name, action="append", default=None, metavar="TEXT",
                               help=f"{meaning}; the flag once per string, 'none' for none "
                               f"(default {' '.join(map(repr, setting.default))})")
        else:
            group.add_argument("--logit-bias", dest=name, action="append", default=None, metavar="ID=BIAS",
                               help=f"{meaning}; the flag once per token, e.g. --logit-bias 50256=-100")
    group.add_argument("--seed", type=int, default=None, help="same seed, same tokens")


def stop_strings(args: argparse.Namespace) -> list[str]:
    """--stop's values, checked before the model loads: an empty one would stop nothing, and they
    are bounded as everywhere (STOP_STRINGS_BOUND)."""
    if "" in args.stop:
        raise ValueError('--stop "": a stop string must not be empty')
    STOP_STRINGS_BOUND.check("--stop", args.stop)
    return args.stop


def note_context_cut(flag: str, wanted: int, model, ids: list[int]) -> None:
    """A length past the context window: generation ends where the window is full (the library's
    finish_reason "length"), so say so before it starts instead of leaving the user waiting for
    steps that cannot come (--max-tokens / --steps 1000000000)."""
    from nexttok.generation.loop import context_window

    window = context_window(model.config)
    room = window - len(ids)
    if wanted > room:
        print(f"note: {flag} {wanted} is past the context window ({window} tokens, {len(ids)} of them the "
              f"prompt's): stopping after {room}", file=sys.stderr, flush=True)


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
    add_sampling_args(p)
    p.add_argument("--stop", action="append", default=[],
                   help=f"stop string (repeatable): {STOP_STRINGS_BOUND.allowed()}")
    p.add_argument("--dtype", default=None, help=DTYPE_HELP)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    if max_tokens is not None:
        p.add_argument("--max-tokens", type=int, default=max_tokens, help="(default %(default)s)")
