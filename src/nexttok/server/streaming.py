"""From a request's running generations to its HTTP answer: one JSON body once every choice is
done, or a stream as the steps arrive. Every API's stream goes through one writer (`stream_response`): its
events as dicts, each framed by the API's wire format (WireFormat: OpenAI's `data: {chunk}` lines
ending with `data: [DONE]`, the Responses API's and Anthropic's `event:` + `data:` lines, Ollama's
NDJSON), an error mid-stream written as that API writes one, every run closed at the end. An API
whose events follow a writer object (opening, a step's events, closing) passes `stepped(...)`."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

from fastapi.responses import StreamingResponse

from nexttok.generation.loop import Step
from nexttok.server.openai_shapes import ResponseFormat, Usage
from nexttok.server.routing import EVENTS, NDJSON, STREAM_HEADERS
from nexttok.server.scheduler import GenerationFailed, RequestTimeout, ShuttingDown
from nexttok.server.traces import Tracer, traces

log = logging.getLogger("nexttok.server")
# what may end a stream that has begun: the API writes it as an error event and the stream ends cleanly
STREAM_ERRORS = (ValueError, RequestTimeout, ShuttingDown, GenerationFailed)


def data_event(payload: dict) -> bytes:
    """data_event({"a": 1}) -> b'data: {"a": 1}\n\n'."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def typed_event(payload: dict) -> bytes:
    """An event named by its type, as the Responses API and Anthropic's Messages API send them:
    typed_event({"type": "ping"}) -> b'event: ping\ndata: {"type": "ping"}\n\n'."""
    return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def ndjson_line(payload: dict) -> bytes:
    """ndjson_line({"done": True}) -> b'{"done": true}\n'."""
    return (json.dumps(payload, ensure_ascii=False) + "\n").encode()


@dataclass(frozen=True)
class WireFormat:
    """How one API writes a stream: its media type, how one event is framed, and what ends the
    stream (after its last event, an error event too)."""

    media_type: str
    frame: Callable[[dict], bytes]
    terminator: bytes = b""


OPENAI_CHUNKS = WireFormat(EVENTS, data_event, b"data: [DONE]\n\n")  # /v1/completions, /v1/chat/completions
TYPED_EVENTS = WireFormat(EVENTS, typed_event)  # /v1/responses, /v1/messages
NDJSON_LINES = WireFormat(NDJSON, ndjson_line)  # Ollama's /api/chat, /api/generate, /api/pull


def stream_response(wire: WireFormat, events: AsyncIterator[dict], runs: list[Run], error: Callable[[Exception], dict],
           errors: tuple[type[Exception], ...] = STREAM_ERRORS) -> StreamingResponse:
    """The answer that streams `events` in `wire`'s format; error(e): the event that says what
    ended the stream early, for an exception among `errors` (others propagate)."""
    return StreamingResponse(written(wire, events, runs, error, errors), media_type=wire.media_type,
                             headers=STREAM_HEADERS)


async def written(wire: WireFormat, events: AsyncIterator[dict], runs: list[Run],
                  error: Callable[[Exception], dict], errors: tuple[type[Exception], ...] = STREAM_ERRORS
                  ) -> AsyncIterator[bytes]:
    """The one event writer: each event framed; an error mid-stream logged with its traceback (a
    failed generation: by the scheduler) and written as the API's error event, and the stream ends
    cleanly; every run closed; the terminator."""
    try:
        async for payload in events:
            yield wire.frame(payload)
    except errors as e:
        if not isinstance(e, GenerationFailed):  # the scheduler logged that one, with where it failed
            log.error("a stream ended early: %s: %s", type(e).__name__, e, exc_info=e)
        yield wire.frame(error(e))
    finally:
        await close(runs)
    if wire.terminator:
        yield wire.terminator


@dataclass
class Run:
    """One choice of a request, submitted to the scheduler: its prompt ids, its choice index and
    the steps the scheduler yields for it."""

    ids: list[int]
    index: int
    steps: AsyncGenerator[Step, None]
    counts_prompt: bool = True  # the first choice of its prompt: usage counts a prompt once, as OpenAI does

    @property
    def prompt_tokens(self) -> int:
        return len(self.ids) if self.counts_prompt else 0


async def respond(runs: list[Run], fmt: ResponseFormat, *, stream: bool, include_usage: bool,
                  trace: Tracer | None = None) -> dict | StreamingResponse:
    """Wait for the first step (errors before it become a 4xx/5xx response), then answer. trace:
    the response also carries each choice's trace (server/traces.py)."""
    first = await first_step(runs)
    if not stream:
        try:
            return await collect(runs, first, fmt, trace)
        except BaseException:
            await close(runs)
            raise
    return stream_response(OPENAI_CHUNKS, chunks(runs, first, fmt, include_usage, trace), runs, openai_stream_error)


async def first_step(runs: list[Run]) -> Step:
    """The first run's first step; an error before it (a full queue, a bad prompt) closes every run
    and propagates, to become the HTTP error a client sees instead of an event."""
    try:
        return await runs[0].steps.__anext__()
    except BaseException:
        await close(runs)
        raise


async def collect(runs: list[Run], first: Step, fmt: ResponseFormat, trace: Tracer | None = None) -> dict:
    """All choices at once; they were submitted together, so they decode in one batch."""
    collected = await asyncio.gather(*(steps_of(run, [first] if n == 0 else []) for n, run in enumerate(runs)))
    usage = Usage()
    choices = []
    for run, steps in zip(runs, collected, strict=True):
        choices.append(fmt.choice(run.index, steps))
        usage.add(run.prompt_tokens, len(steps))
    response = fmt.response(choices, usage)
    if trace is not None:
        response["trace"] = traces([trace(run.ids, run.index, steps) for run, steps in zip(runs, collected,
                                                                                          strict=True)])
    return response


async def steps_of(run: Run, first: list[Step] | None = None) -> list[Step]:
    """Every step of one run (first: those already taken from it)."""
    return [s async for s in chained(first or [], run.steps)]


async def close(runs: list[Run]) -> None:
    """End every run's generation (the scheduler drops a request whose steps are closed early)."""
    for run in runs:
        await run.steps.aclose()


async def chunks(runs: list[Run], first: Step, fmt: ResponseFormat, include_usage: bool,
                 trace: Tracer | None = None) -> AsyncIterator[dict]:
    """OpenAI's chunks: the choices one after another (with include_usage, each with "usage": null),
    then the usage chunk. With trace, the traces come last (a chunk with no choices, as that is)."""
    usage = Usage()
    traced = []
    for n, run in enumerate(runs):
        count = sent = 0  # steps, and characters of text sent so far
        steps = []
        async for step in chained([first] if n == 0 else [], run.steps):
            steps.append(step)
            if count == 0:  # a choice opens once its prefill is done (echo sends the prompt's scores)
                for chunk in fmt.start_chunks(run.index):
                    yield with_usage(chunk, include_usage)
                    sent += len(chunk["choices"][0].get("text", ""))
            count += 1
            chunk = fmt.step_chunk(run.index, step, sent)
            sent += len(step.text)
            if chunk is not None:
                yield with_usage(chunk, include_usage)
        usage.add(run.prompt_tokens, count)
        if trace is not None:
            traced.append(trace(run.ids, run.index, steps))
    if include_usage:
        yield fmt.usage_chunk(usage)
    if trace is not None:
        yield {**fmt.usage_chunk(usage), "usage": None, "trace": traces(traced)}


def with_usage(chunk: dict, include_usage: bool) -> dict:
    """With include_usage, every chunk but the usage chunk carries "usage": null."""
    return {**chunk, "usage": None} if include_usage and "usage" not in chunk else chunk


def openai_stream_error(e: Exception) -> dict:
    """An error in the middle of an OpenAI stream, as its event."""
    kind = "timeout_error" if isinstance(e, RequestTimeout) else "server_error"
    return {"error": {"message": str(e), "type": kind, "param": None, "code": None}}


async def chained(first: list[Step], rest: AsyncIterator[Step]) -> AsyncIterator[Step]:
    """The steps already taken from a run, then the rest, ending at the step that finishes it."""
    for step in first:
        yield step
        if step.finish_reason:
            return
    async for step in rest:
        yield step


async def stepped(events, first: Step, rest: AsyncIterator[Step]) -> AsyncIterator[dict]:
    """The events of an API's writer object (the Responses API's, Anthropic's, Ollama's):
    events.opening(), then events.step(step) for each step, then events.closing()."""
    for payload in events.opening():
        yield payload
    async for step in chained([first], rest):
        for payload in events.step(step):
            yield payload
    for payload in events.closing():
        yield payload
