"""Ollama's wire format, from the Steps of one generation: NDJSON (one JSON object a line) as the
steps arrive, or one object once it is done.

    {"model", "created_at", "message": {"role": "assistant", "content": "The"}, "done": false}   /api/chat
    {"model", "created_at", "response": "The", "done": false}                                  /api/generate
    ... the last object: "done": true, "done_reason" (stop, length), the counts and durations

Durations are nanoseconds, measured: prompt_eval_duration is the prefill's step (the forward pass
over the prompt and the first token's sampling, timed by the scheduler), eval_duration the other
steps', load_duration the time before the prefill began (template, tokenizing, waiting for a slot
in the batch: the model itself is loaded when the server starts), total_duration arrival to end.
"""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass, field

from fastapi.responses import JSONResponse, StreamingResponse

from nexttok.generation.loop import Step
from nexttok.generation.tools import ReplyStream, read_reply
from nexttok.server.openai_shapes import token_logprobs
from nexttok.server.streaming import NDJSON_LINES, Run, close, first_step, stepped, steps_of, stream_response


def created_at() -> str:
    """Now, as Ollama writes it: created_at() -> "2025-07-07T20:22:19.184789Z"."""
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


def nanoseconds(seconds: float) -> int:
    """nanoseconds(0.25) == 250000000."""
    return max(0, round(seconds * 1e9))


@dataclass
class OllamaWire:
    """One request's answer shape. chat: a `message` (else generate's `response`); tools: the reply
    is tools.py's JSON, read as it is generated (tools.ReplyStream): its text streams as content,
    each call goes out in one object once its arguments are whole (as Ollama sends a parsed call);
    top_logprobs: None, or each token's logprob with this many alternatives; context: generate's
    final `context` (prompt + output ids)."""

    model: str
    tokenizer: object
    prompt_ids: list[int]
    chat: bool
    tools: bool = False
    top_logprobs: int | None = None
    context: bool = False
    arrived: float = field(default_factory=time.perf_counter)
    first_at: float | None = None  # when the first step (the prefill's) reached the request
    reading: ReplyStream = field(default_factory=ReplyStream)  # the reply to tools, read so far
    streamed: list[Step] = field(default_factory=list)  # the steps a stream has had

    # the stream's events, through streaming.stepped: an object per step with text (or a whole tool
    # call), then the final one
    def opening(self) -> list[dict]:
        return []

    def step(self, step: Step) -> list[dict]:
        self.streamed.append(step)
        chunk = self.step_chunk(step)
        return [] if chunk is None else [chunk]

    def closing(self) -> list[dict]:
        return [self.final(self.streamed)]

    def envelope(self, done: bool) -> dict:
        return {"model": self.model, "created_at": created_at(), "done": done}

    def text(self, content: str, calls: list[dict] | None = None) -> dict:
        """The text fields: chat's message (with tool_calls), or generate's response."""
        if not self.chat:
            return {"response": content}
        message = {"role": "assistant", "content": content}
        return {"message": {**message, "tool_calls": calls} if calls else message}

    def logprobs(self, steps: list[Step]) -> dict:
        if self.top_logprobs is None:
            return {}
        return {"logprobs": token_logprobs(self.tokenizer, steps, self.top_logprobs)}

    def step_chunk(self, step: Step) -> dict | None:
        """A step's object (None: nothing to send)."""
        content, calls = self._read(step.text) if self.tools else (step.text, [])
        if not content and not calls and self.top_logprobs is None:
            return None
        return {**self.envelope(False), **self.text(content, calls), **self.logprobs([step])}

    def _read(self, text: str) -> tuple[str, list[dict]]:
        """(content, calls now whole) that a piece of a reply to tools adds."""
        events = self.reading.feed(text)
        content = "".join(e.text for e in events if e.kind == "content")
        done = [self.reading.calls[e.index] for e in events if e.kind == "call_done"]
        return content, [_ollama_call(call.index, call.openai()) for call in done]

    def reply(self, steps: list[Step]) -> tuple[str, list[dict]]:
        """(content, tool calls) of the whole output."""
        text = "".join(s.text for s in steps)
        if not self.tools:
            return text, []
        content, calls = read_reply(text)
        return content or "", [_ollama_call(k, call) for k, call in enumerate(calls)]

    def final(self, steps: list[Step], content: str = "", calls: list[dict] | None = None) -> dict:
        """The last object: done, why, the counts and durations (and, for generate, the context)."""
        end = time.perf_counter()
        total, prefill = nanoseconds(end - self.arrived), nanoseconds(steps[0].elapsed)
        evaluated = nanoseconds(sum(s.elapsed for s in steps[1:]))
        # The first step reaches this request a little after the scheduler made it, and later steps
        # may already be done by then: first_at - prefill overstates when the prefill began. The
        # steps ran one after another inside arrival..end, so total - prefill - eval bounds it too.
        waited = min(nanoseconds((self.first_at or end) - self.arrived) - prefill, total - prefill - evaluated)
        final = {**self.envelope(True), **self.text(content, calls), "done_reason": steps[-1].finish_reason or "length",
                 "total_duration": total, "load_duration": max(0, waited),
                 "prompt_eval_count": len(self.prompt_ids), "prompt_eval_duration": prefill,
                 "eval_count": len(steps), "eval_duration": evaluated}
        if self.context:
            final["context"] = [*self.prompt_ids, *(s.token_id for s in steps)]
        return final

    def whole(self, steps: list[Step]) -> dict:
        """The one object of stream: false."""
        content, calls = self.reply(steps)
        return {**self.final(steps, content, calls), **self.logprobs(steps)}


def _ollama_call(index: int, call: dict) -> dict:
    """An OpenAI-shaped call (arguments as JSON text) as Ollama's: arguments as an object."""
    function = call["function"]
    return {"id": call["id"], "function": {"index": index, "name": function["name"],
                                           "arguments": json.loads(function["arguments"])}}


async def answer(run: Run, wire: OllamaWire, *, stream: bool) -> JSONResponse | StreamingResponse:
    """Wait for the first step (an error before it is an HTTP error in Ollama's shape), then
    answer: NDJSON as the steps come, or one object at the end."""
    first = await first_step([run])
    wire.first_at = time.perf_counter()
    if not stream:
        try:
            return JSONResponse(wire.whole(await steps_of(run, [first])))
        except BaseException:
            await close([run])
            raise
    # an error mid-stream is an {"error": ...} line (what Ollama's client raises as ResponseError)
    return stream_response(NDJSON_LINES, stepped(wire, first, run.steps), [run], lambda e: {"error": str(e)})
