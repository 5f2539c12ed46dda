"""The lesson's traces: the Experiments' runs recorded as `nexttok run --trace` records them, two
traces compared as `nexttok diff` compares them (generation/diff.py), and an explainer session's
path as a trace of its own.

POST /explain/traces/diff            {a: [lines], b: [lines], name_a?, name_b?}  -> a diff view
POST /explain/sessions/{id}/trace    {node?}  -> the trace of the session's path to node (default: current)

A diff view: each run's tokens, the first step where they part, each run's token there with its
probability, the gap p(A) - p(B) and whether it is a near tie, each run's text from there on, and
the header settings in which the two differ.
"""

from __future__ import annotations

import math
import time
from typing import Annotated

import anyio
from fastapi import APIRouter
from pydantic import Field, StringConstraints

from nexttok.errors import InvalidParameter
from nexttok.generation.diff import NEAR_TIE, TraceDiff, diff_traces
from nexttok.generation.loop import stream
from nexttok.generation.sampling import SamplingParams
from nexttok.generation.trace import FORMAT, VERSION, Trace, TraceError, parse_trace, recorded, trace_header
from nexttok.server.engine import ServedModel
from nexttok.server.schemas import Strict
from nexttok.server.traces import served_sha256

TRACE_TOP_N = 5  # alternatives a lesson's run records per step (as nexttok run --trace)
MAX_TRACE_LINES = 20_000  # a header, an end line and up to 19,998 steps
MAX_LINE_CHARS = 1_000_000  # a header holds the prompt's ids: 4096 of them take ~25 kB

TraceLine = Annotated[str, Field(max_length=MAX_LINE_CHARS)]
TraceLines = Annotated[list[TraceLine], Field(min_length=1, max_length=MAX_TRACE_LINES)]
TraceName = Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f]{1,200}$")]  # one line: it starts errors


class DiffRequest(Strict):
    a: TraceLines = Field(description="the lines of trace A (a nexttok-trace JSON Lines file)")
    b: TraceLines = Field(description="the lines of trace B")
    name_a: TraceName = Field("trace A", description="what errors call trace A (its file name)")
    name_b: TraceName = Field("trace B", description="what errors call trace B")


class TraceRequest(Strict):
    node: int | None = Field(None, ge=0, description="a node of the session's tree (default: the current one)")


def lesson_trace(served: ServedModel, sha256: str, prompt: str, ids: list[int], params: SamplingParams,
                 max_tokens: int, name: str) -> Trace:
    """One run of the model on the prompt's ids, recorded as `nexttok run --trace` would record it."""
    start = time.perf_counter()
    steps = list(stream(served.model, served.tokenizer, ids, params, max_tokens=max_tokens, top_n=TRACE_TOP_N))
    header = trace_header(served.model, name=served.name, path=served.path, sha256=sha256, prompt_text=prompt,
                          prompt_ids=ids, params=params, max_tokens=max_tokens, stop=[],
                          stop_token_ids=list(served.model.config.eos_token_id), top_n=TRACE_TOP_N)
    return recorded(header, steps, time.perf_counter() - start, name)


def trace_lines(trace: Trace) -> list[dict]:
    """A trace as the lines of its file (each a JSON object): header, steps, end."""
    return [trace.header, *trace.steps, trace.end]


def diff_view(d: TraceDiff) -> dict:
    """What the page shows of a diff: see the module's docstring."""
    v = d.divergence
    sides = [(d.a, None if v is None else v.a, "" if v is None else v.text_a),
             (d.b, None if v is None else v.b, "" if v is None else v.text_b)]
    return {"identical": d.identical, "index": None if v is None else v.index,
            "gap": None if v is None else v.gap, "near_tie": v is not None and v.near_tie, "near_tie_nats": NEAR_TIE,
            "runs": [_side(trace, step, after) for trace, step, after in sides],
            "settings": [{"what": what, "a": a, "b": b} for what, a, b in d.settings]}


def _side(trace: Trace, step: dict | None, after: str) -> dict:
    """One run of a diff view; at: its token where the runs part (None: identical, or it had ended)."""
    at = None if step is None else {"id": step["id"], "text": step["token_text"], "logprob": step["logprob"],
                                    "p": math.exp(step["logprob"]), "rank": step["rank"]}
    return {"name": trace.name, "tokens": [{"id": s["id"], "text": s["token_text"]} for s in trace.steps],
            "text": trace.text, "finish_reason": trace.end["finish_reason"], "at": at, "after": after}


def parsed(lines: list[str], name: str, param: str) -> Trace:
    """A trace sent as its lines, read as strictly as a file (parse_trace); refused naming param."""
    try:
        return parse_trace(lines, name)
    except TraceError as e:
        raise InvalidParameter(param, str(e)) from None


def install_traces(router: APIRouter, explainer) -> None:
    @router.post("/explain/traces/diff")
    async def diff(body: DiffRequest):
        """Two trace files side by side, as `nexttok diff A B` shows them."""
        def compute():  # validating thousands of lines against the schema takes a while
            return diff_view(diff_traces(parsed(body.a, body.name_a, "a"), parsed(body.b, body.name_b, "b")))

        return await anyio.to_thread.run_sync(compute)

    @router.post("/explain/sessions/{key}/trace")
    async def session_trace(key: str, body: TraceRequest):
        """The session's path as the trace of one run: its steps with the dials they were sampled
        with (one setting for the whole path) and the session's seed; its max_tokens is the path's
        length, so a path that did not stop ends by "length"."""
        opened = explainer.session(key)
        session, served = opened.session, opened.served
        async with explainer.state(served).lock:  # no step changes the tree while it is read
            node = session.current if body.node is None else body.node
            run = session.run(node)
        sha256 = await anyio.to_thread.run_sync(lambda: served_sha256(served, "session"))
        header = trace_header(served.model, name=served.name, path=served.path, sha256=sha256,
                              prompt_text=session.prompt_text, prompt_ids=session.prompt_ids, params=run.params,
                              max_tokens=len(run.steps), stop=[], stop_token_ids=session.stop_ids,
                              top_n=max(len(s.top) for s in run.steps), use_cache=run.use_cache)
        trace = recorded(header, run.steps, sum(s.elapsed for s in run.steps), "the session")
        return {"format": FORMAT, "version": VERSION, "node": node, "lines": trace_lines(trace)}
