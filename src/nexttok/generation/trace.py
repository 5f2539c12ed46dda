"""Traces: one generation recorded as JSON Lines, to replay it or compare it with another run.

Line 1 is the header (what ran: the model and its sha256, dtype, device, CPU kernels, engine and
torch versions, the prompt ids, every sampling parameter and the seed), then one "step" line per
generated token (id, text, logprob, rank, the top alternatives, each sampler stage's kept count,
the uniform draw, seconds, finish reason), then an "end" line. `trace.schema.json` beside this
module is the format's JSON Schema, less the sampling record, which `schema()` fills in from the
stages' descriptions (every setting of every stage, its bounds); FORMAT and VERSION name it. Reading
is additive: a setting a trace lacks (one written before its stage existed) takes its neutral
default, so a version 1 trace still replays. A file is written as the run goes
(a step is on disk when it is printed), so a run that dies leaves a file without its end line, and
reading one says so.

    with TraceWriter(path, header) as trace:
        for step in stream(...):
            trace.step(step)
    read_trace(path).token_ids
"""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import IO

import torch

from nexttok.generation.loop import Step
from nexttok.generation.sampling import SamplingParams
from nexttok.generation.stages import SEED, SETTINGS, STAGE_NAMES
from nexttok.models import kernels

FORMAT = "nexttok-trace"
VERSION = 2  # 2: the sampling record holds every stage's settings (1: the first ten)
READS = (1, 2)  # versions this nexttok reads
# what a version 1 sampling record always holds; every later setting is optional when reading
VERSION_1_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                      "frequency_penalty", "logit_bias", "seed", "order")
# What a trace file may hold. The longest line is the header, with the prompt's text and ids: 16 MiB
# is a prompt of about a million tokens. 1 GiB is about two million steps with top alternatives.
# Past either, the file is not a trace (/dev/zero is one endless line) and is refused by name.
MAX_LINE_BYTES = 16 << 20
MAX_TRACE_BYTES = 1 << 30


class TraceError(ValueError):
    """A trace file that is malformed, truncated, of another format, or of another model."""


def schema() -> dict:
    """The JSON Schema of one trace line (header, step or end)."""
    found = json.loads(resources.files("nexttok.generation").joinpath("trace.schema.json").read_text("utf-8"))
    found["$defs"]["header"]["properties"]["sampling"] = sampling_schema()
    return found


def sampling_schema() -> dict:
    """The header's sampling record: each stage's settings, the seed and the stages' order."""
    settings = {name: {**setting.schema(), "description": setting.meaning} for name, setting in SETTINGS.items()}
    return {"type": "object", "required": list(VERSION_1_SAMPLING), "additionalProperties": False,
            "description": "every setting of every sampler stage (nexttok.generation.stages); one a trace lacks "
                           "takes its neutral default",
            "properties": {**settings, "seed": {**SEED.schema(), "type": ["integer", "null"]},
                           "order": {"type": "array", "items": {"enum": list(STAGE_NAMES)}}}}


def trace_header(model, *, name: str, path: Path, sha256: str, prompt_text: str | None, prompt_ids: list[int],
                 params: SamplingParams, max_tokens: int | None, stop: list[str], stop_token_ids: list[int],
                 top_n: int, use_cache: bool = True, grammar: dict | None = None,
                 speculative: dict | None = None) -> dict:
    """The header line of a generation of `model` (a loaded Model) from the checkpoint at path.
    grammar: the constraint the output followed, {"kind": "json_schema", "schema": {...}}, or None.
    speculative: {"drafter": "ngram" or a model, "draft_tokens": k} when the run drafted."""
    weights = next(model.parameters())
    return {"type": "header", "format": FORMAT, "version": VERSION,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "engine": {"name": "nexttok", "version": metadata.version("nexttok"), "torch": torch.__version__},
            "model": {"name": name, "path": str(path), "sha256": sha256,
                      "architecture": model.config.model_type, "vocab_size": model.config.vocab_size},
            "runtime": {"dtype": str(weights.dtype).removeprefix("torch."), "device": str(weights.device),
                        "kernels": kernels.describe(), "threads": torch.get_num_threads(),
                        "compiled": model.compiled is not None, "kv_cache": use_cache,
                        "speculative": speculative},
            "prompt": {"text": prompt_text, "ids": list(prompt_ids)},
            "sampling": sampling_record(params),
            "limits": {"max_tokens": max_tokens, "stop": list(stop), "stop_token_ids": list(stop_token_ids)},
            "grammar": grammar, "top_n": top_n}


def grammar_record(schema: dict | None) -> dict | None:
    """The header's grammar: the JSON schema a constrained run followed ({"type": "object"}: any
    object, OpenAI's json_object), or None."""
    if schema is None:
        return None
    return {"kind": "json_object" if schema == {"type": "object"} else "json_schema", "schema": schema}


def sampling_record(params: SamplingParams) -> dict:
    """Every field of params, as JSON holds them (logit_bias keys as strings)."""
    return {**{name: setting.to_json(getattr(params, name)) for name, setting in SETTINGS.items()},
            "seed": params.seed, "order": list(params.order)}


def step_record(step: Step) -> dict:
    return {"type": "step", "index": step.index, "id": step.token_id, "text": step.text, "token_text": step.token_text,
            "logprob": step.logprob, "rank": step.rank,
            "top": [{"id": a.id, "logprob": a.logprob} for a in step.top],
            "stages": [{"name": s.name, "kept": s.kept} for s in step.stages or []],
            "draw": step.draw, "elapsed": step.elapsed, "prefill": step.prefill,
            "finish_reason": step.finish_reason,
            "draft": None if step.draft is None else {"id": step.draft.token_id, "accepted": step.draft.accepted}}


def end_record(steps: list[dict], elapsed: float) -> dict:
    return {"type": "end", "finish_reason": steps[-1]["finish_reason"] if steps else None,
            "completion_tokens": len(steps), "text": "".join(s["text"] for s in steps), "elapsed": elapsed}


class TraceWriter:
    """Writes a trace as the run goes: the header now, a line per step, the end line on close."""

    def __init__(self, path: str | Path, header: dict):
        self.path, self.steps, self.start = Path(path), [], time.perf_counter()
        try:
            self.file: IO[str] = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close)
        except OSError as e:
            raise TraceError(f"--trace {path}: cannot write it ({e.strerror})") from None
        self._write(header)

    def _write(self, record: dict) -> None:
        self.file.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        self.file.flush()

    def step(self, step: Step) -> None:
        record = step_record(step)
        self.steps.append(record)
        self._write(record)

    def close(self) -> None:
        """The end line: written only once the generation finished (its last step has a reason)."""
        if not self.file.closed:
            if self.steps and self.steps[-1]["finish_reason"]:
                self._write(end_record(self.steps, time.perf_counter() - self.start))
            self.file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class Trace:
    """A trace read back: its header, step records and end record (dicts as the schema has them)."""

    header: dict
    steps: list[dict]
    end: dict
    name: str  # the file, for messages

    @property
    def prompt_ids(self) -> list[int]:
        return self.header["prompt"]["ids"]

    @property
    def token_ids(self) -> list[int]:
        return [s["id"] for s in self.steps]

    @property
    def text(self) -> str:
        return self.end["text"]

    def sampling_params(self) -> SamplingParams:
        """The run's settings; any the trace lacks (an older version's) at their neutral defaults."""
        return SamplingParams(**{name: SETTINGS[name].from_json(value) if name in SETTINGS else value
                                 for name, value in self.header["sampling"].items()})

    def check_model(self, sha256: str, what: str) -> None:
        """A one-line error when the trace was recorded on another checkpoint."""
        recorded = self.header["model"]["sha256"]
        if recorded != sha256:
            raise TraceError(f"{self.name} was recorded on {self.header['model']['name']} (sha256 {recorded[:12]}…), "
                             f"not on {what} (sha256 {sha256[:12]}…)")


def recorded(header: dict, steps: list[Step], elapsed: float, name: str = "the run") -> Trace:
    """The Trace of a run held in memory (a live diff, the server's trace object)."""
    records = [step_record(step) for step in steps]
    return Trace(header, records, end_record(records, elapsed), name)


def read_trace(path: str | Path) -> Trace:
    """A trace file, checked line by line against the schema and for what the schema cannot say
    (the order of the lines, consecutive step indices, a finished run)."""
    try:
        with open(path, "rb") as f:
            lines = _read_lines(f, str(path))
    except OSError as e:
        raise TraceError(f"trace {path}: cannot read it ({e.strerror})") from None
    return parse_trace(lines, str(path))


def _read_lines(f: IO[bytes], path: str) -> list[str]:
    """The file's lines as text, split at "\\n" only (the writer leaves U+2028 in a token's text
    unescaped), each at most MAX_LINE_BYTES and all of them at most MAX_TRACE_BYTES."""
    lines, read = [], 0
    while line := f.readline(MAX_LINE_BYTES + 1):
        if len(line) > MAX_LINE_BYTES:
            raise TraceError(f"trace {path}: line {len(lines) + 1} is longer than {MAX_LINE_BYTES >> 20} MiB, "
                             "more than a trace line holds (is it a trace?)")
        if read + len(line) > MAX_TRACE_BYTES:
            raise TraceError(f"trace {path}: larger than {MAX_TRACE_BYTES >> 30} GiB, more than a trace holds "
                             "(is it a trace?)")
        try:
            lines.append(line.decode("utf-8").removesuffix("\n").removesuffix("\r"))
        except UnicodeDecodeError as e:
            raise TraceError(f"trace {path}: not UTF-8 text (byte {read + e.start})") from None
        read += len(line)
    return lines


def parse_trace(lines: list[str], name: str) -> Trace:
    import jsonschema  # only where a trace is read (~0.1 s to import)

    defs = schema()["$defs"]
    validators = {kind: jsonschema.Draft202012Validator({"$defs": defs, "$ref": f"#/$defs/{kind}"})
                  for kind in ("header", "step", "end")}
    records = []
    for number, line in enumerate(lines, start=1):
        record = _json_line(line, f"{name} line {number}")
        kind = record.get("type")
        if kind not in validators:
            raise TraceError(f"{name} line {number}: type {kind!r}: a trace line is a header, a step or an end")
        error = jsonschema.exceptions.best_match(validators[kind].iter_errors(record))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "the line"
            raise TraceError(f"{name} line {number}: {where}: {error.message}")
        records.append(record)
    if not records or records[0]["type"] != "header":
        raise TraceError(f"{name}: not a {FORMAT} file (its first line is not a header)")
    if records[0]["version"] not in READS:
        raise TraceError(f"{name}: {FORMAT} version {records[0]['version']}; this nexttok reads versions "
                         f"{', '.join(map(str, READS))}")
    kinds = [r["type"] for r in records]
    if kinds[-1] != "end":
        raise TraceError(f"{name}: truncated: no end line after {kinds.count('step')} steps (the run did not finish)")
    if kinds.count("header") != 1 or kinds.count("end") != 1:
        raise TraceError(f"{name}: a trace has one header first and one end line last")
    steps = records[1:-1]
    for i, step in enumerate(steps):
        if step["index"] != i:
            raise TraceError(f"{name} line {i + 2}: step index {step['index']}, expected {i}")
    if records[-1]["completion_tokens"] != len(steps):
        raise TraceError(f"{name}: the end line counts {records[-1]['completion_tokens']} tokens, the file has "
                         f"{len(steps)} steps")
    return Trace(records[0], steps, records[-1], name)


def _json_line(line: str, where: str) -> dict:
    def refuse(constant: str):
        raise TraceError(f"{where}: {constant} is not a number a trace may hold")

    try:
        record = json.loads(line, parse_constant=refuse)
    except json.JSONDecodeError as e:
        raise TraceError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict):
        raise TraceError(f"{where}: a trace line is a JSON object, got {type(record).__name__}")
    return record
