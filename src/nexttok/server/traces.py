"""A request's traces, on demand (`"nexttok": {"trace": true}` in the body): each choice's lines of
a trace file (generation/trace.py), so that a client can save them as .jsonl and `nexttok replay` or
`nexttok diff` them. Without the option the response is OpenAI's shape, byte for byte.

    {"trace": {"format": "nexttok-trace", "version": 1,
               "choices": [{"index": 0, "lines": [header, step, ..., end]}]}}
"""

from __future__ import annotations

from collections.abc import Callable

from nexttok.checkpoints.identity import checkpoint_sha256
from nexttok.errors import InvalidParameter
from nexttok.generation.loop import Step
from nexttok.generation.trace import FORMAT, VERSION, grammar_record, recorded, trace_header
from nexttok.server.engine import ServedModel

Tracer = Callable[[list[int], int, list[Step]], dict]  # (prompt ids, choice index, steps) -> a choice's trace


def served_sha256(served: ServedModel, param: str = "nexttok") -> str:
    """The sha256 a trace names the served model's checkpoint by (hashed once per file and change,
    ~1 s a GB: call it off the event loop); a model loaded from no file is refused naming param."""
    if served.path is None:
        raise InvalidParameter(param, f"model {served.name!r} was not loaded from a checkpoint file: "
                               "a trace names its checkpoint by sha256")
    return checkpoint_sha256(served.path)


def tracer(served: ServedModel, plan) -> Tracer:
    """What turns a finished choice into its trace. It hashes the checkpoint (served_sha256): call
    it off the event loop."""
    sha256 = served_sha256(served)

    def trace(ids: list[int], index: int, steps: list[Step]) -> dict:
        header = trace_header(served.model, name=served.name, path=served.path, sha256=sha256, prompt_text=None,
                              prompt_ids=ids, params=plan.params_for_choice(index), max_tokens=plan.max_tokens,
                              stop=list(plan.stop), stop_token_ids=list(served.model.config.eos_token_id),
                              top_n=plan.top_n, grammar=grammar_record(plan.schema))
        run = recorded(header, steps, sum(s.elapsed for s in steps))
        return {"index": index, "lines": [run.header, *run.steps, run.end]}

    return trace


def traces(choices: list[dict]) -> dict:
    """The `trace` member of a response: every choice's trace, by choice index."""
    return {"format": FORMAT, "version": VERSION, "choices": sorted(choices, key=lambda c: c["index"])}
