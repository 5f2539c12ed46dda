"""From a request's running generations to its HTTP answer: one JSON body once every choice is
done, or server-sent events (`data: {chunk}` lines, then `data: [DONE]`) as the steps arrive.
The Responses and Anthropic routes write their own events with typed_event (`event:` + `data:`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from fastapi.responses import StreamingResponse

from nexttok.generation.loop import Step
from nexttok.server.openai_shapes import ResponseFormat, Usage
from nexttok.server.scheduler import GenerationFailed, RequestTimeout, ShuttingDown
from nexttok.server.traces import Tracer, traces


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
    return StreamingResponse(events(runs, first, fmt, include_usage, trace), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


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


async def events(runs: list[Run], first: Step, fmt: ResponseFormat, include_usage: bool,
                 trace: Tracer | None = None) -> AsyncIterator[bytes]:
    """The event stream: the choices one after another; an error mid-stream becomes an error event.
    With trace, the traces come last, after the usage chunk (a chunk with no choices, as that is)."""
    usage = Usage()
    traced = []
    try:
        for n, run in enumerate(runs):
            count = sent = 0  # steps, and characters of text sent so far
            steps = []
            async for step in chained([first] if n == 0 else [], run.steps):
                steps.append(step)
                if count == 0:  # a choice opens once its prefill is done (echo sends the prompt's scores)
                    for chunk in fmt.start_chunks(run.index):
                        yield event(chunk, include_usage)
                        sent += len(chunk["choices"][0].get("text", ""))
                count += 1
                chunk = fmt.step_chunk(run.index, step, sent)
                sent += len(step.text)
                if chunk is not None:
                    yield event(chunk, include_usage)
            usage.add(run.prompt_tokens, count)
            if trace is not None:
                traced.append(trace(run.ids, run.index, steps))
        if include_usage:
            yield event(fmt.usage_chunk(usage), False)
        if trace is not None:
            yield event({**fmt.usage_chunk(usage), "usage": None, "trace": traces(traced)}, False)
    except (ValueError, RequestTimeout, ShuttingDown, GenerationFailed) as e:  # say so, end cleanly
        kind = "timeout_error" if isinstance(e, RequestTimeout) else "server_error"
        yield event({"error": {"message": str(e), "type": kind, "param": None, "code": None}}, False)
    finally:
        await close(runs)
    yield b"data: [DONE]\n\n"


async def chained(first: list[Step], rest: AsyncIterator[Step]) -> AsyncIterator[Step]:
    """The steps already taken from a run, then the rest, ending at the step that finishes it."""
    for step in first:
        yield step
        if step.finish_reason:
            return
    async for step in rest:
        yield step


async def typed_events(events, first: Step, rest: AsyncIterator[Step]) -> AsyncIterator[bytes]:
    """A typed event stream (Responses, Anthropic) from its writer: events.opening(), then
    events.step(step) for each step, then events.closing(), each event through typed_event."""
    for payload in events.opening():
        yield typed_event(payload)
    async for step in chained([first], rest):
        for payload in events.step(step):
            yield typed_event(payload)
    for payload in events.closing():
        yield typed_event(payload)


def typed_event(payload: dict) -> bytes:
    """An event named by its type, as the Responses API and Anthropic's Messages API send them:
    typed_event({"type": "ping"}) -> b'event: ping\ndata: {"type": "ping"}\n\n'."""
    return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def event(payload: dict, include_usage: bool) -> bytes:
    """event({"a": 1}, False) -> b'data: {"a": 1}\\n\\n'; with include_usage, chunks carry "usage": null."""
    if include_usage and "usage" not in payload:
        payload = {**payload, "usage": None}
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()
