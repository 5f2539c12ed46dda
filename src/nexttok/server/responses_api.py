"""POST /v1/responses (OpenAI's Responses API) over the chat route's generation path, and
GET / DELETE /v1/responses/{id} for the responses it keeps.

A request becomes chat messages (instructions first, as a system message), the chat template and
tools (responses_items.py), one generation on the model's scheduler, and a `response` object with
output items, or, with stream, the documented events in order:

    response.created, response.in_progress,
    response.output_item.added, response.content_part.added, response.output_text.delta...,
    response.output_text.done, response.content_part.done, response.output_item.done,
    (function calls: output_item.added, function_call_arguments.delta / .done, output_item.done)
    response.completed (or response.incomplete when max_output_tokens cut it)

Responses are kept (store, true unless the request says false) in memory, the latest
STORED_RESPONSES: previous_response_id continues from one (its input and output, not its
instructions, as OpenAI has it).
"""

from __future__ import annotations

import collections
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field, ValidationError

from nexttok.errors import InvalidParameter
from nexttok.server.completions import chat_plan
from nexttok.server.engine import ServedModel
from nexttok.server.errors import APIError
from nexttok.server.responses_items import (
    LOGPROBS,
    ResponseBuilder,
    as_messages,
    chat_tools,
    input_messages,
    output_format,
    usage,
)
from nexttok.server.responses_stream import ResponseEvents
from nexttok.server.routing import EVENTS, streams
from nexttok.server.schemas import MAX_TOP_LOGPROBS, ChatRequest, Strict, bounded
from nexttok.server.streaming import TYPED_EVENTS, Run, close, first_step, stepped, steps_of, stream_response

STORED_RESPONSES = 256
# the chat request's fields that come from differently named fields here
CHAT_FIELDS = {"messages": "input", "response_format": "text", "max_completion_tokens": "max_output_tokens"}


class ResponsesRequest(Strict):
    """Every field of OpenAI's ResponseCreateParams; those that mean nothing here are accepted."""

    model: str
    input: str | Annotated[list[Any], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = bounded("temperature")
    top_p: float | None = bounded("top_p")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    include: list[str] | None = Field(None, description=f'"{LOGPROBS}" adds the output tokens\' logprobs')
    stream: bool = False
    stream_options: dict[str, Any] | None = Field(None, description="accepted (include_obfuscation: none here)")
    text: dict[str, Any] | None = Field(None, description="format: text, json_object or json_schema")
    tools: Annotated[list[Any], Field(max_length=64)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = Field(None, description="more than one call per reply; default false")
    max_tool_calls: int | None = Field(None, ge=1, description="calls per reply, with parallel_tool_calls")
    store: bool | None = Field(None, description="kept in memory for previous_response_id; default true")
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = Field(None, description="a prompt over the context is a 400")
    background: bool | None = Field(None, description="only false: responses run while the request waits")
    conversation: str | dict[str, Any] | None = Field(None, description="refused: no conversation objects here")
    prompt: dict[str, Any] | None = Field(None, description="refused: no stored prompt templates here")
    reasoning: dict[str, Any] | None = Field(None, description="accepted; no reasoning apart here")
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    image: dict[str, Any] | None = Field(None, description="accepted; text models here")
    access_programs: Any = None
    background_options: dict[str, Any] | None = None
    context_management: Any = None


router = APIRouter()
EVENT_STREAM = streams(EVENTS, "event: {type} and data: {event} lines, each event with its sequence_number, "
                               "ending with response.completed or response.incomplete")


def response_store() -> collections.OrderedDict[str, tuple[dict, list[dict]]]:
    """An app's kept responses (app.state.responses): response id -> (response, its conversation)."""
    return collections.OrderedDict()


@router.post("/v1/responses", responses=EVENT_STREAM)
async def create_response(body: ResponsesRequest, request: Request):
    return await _create(await request.app.state.pool.get(body.model), body, request.app.state.responses)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request):
    return _stored(request.app.state.responses, response_id, "response_id")[0]


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request):
    store = request.app.state.responses
    _stored(store, response_id, "response_id")
    del store[response_id]
    return {"id": response_id, "object": "response.deleted", "deleted": True}


def _stored(store, response_id: str, param: str) -> tuple[dict, list[dict]]:
    if response_id not in store:
        raise APIError(404, f"no response with id {response_id!r} is kept here", param=param, code="not_found")
    return store[response_id]


def _refuse_unavailable(body: ResponsesRequest) -> None:
    for name, unavailable in (("background", body.background), ("conversation", body.conversation is not None),
                              ("prompt", body.prompt is not None)):
        if unavailable:
            raise InvalidParameter(name, f"{name} is not available on this server")


async def _create(served: ServedModel, body: ResponsesRequest, store):
    """One response: its conversation (a kept response's, then this input) generated as chat."""
    _refuse_unavailable(body)
    history = _stored(store, body.previous_response_id, "previous_response_id")[1] if body.previous_response_id else []
    messages = [*history, *input_messages(body.input)]
    logprobs = (body.top_logprobs or 0) if LOGPROBS in (body.include or []) else None
    ids, plan, tool_list = chat_plan(served, _chat_request(body, messages, logprobs), max_calls=body.max_tool_calls)
    builder = ResponseBuilder(served.name, _echoed(body), bool(tool_list), served.tokenizer, logprobs)
    run = Run(ids, 0, served.scheduler.submit(plan.generation(served, ids, 0)))

    def keep(response: dict) -> None:
        if body.store is not False:
            store[response["id"]] = (response, [*messages, *as_messages(response["output"])])
            while len(store) > STORED_RESPONSES:
                store.popitem(last=False)

    if body.stream:
        first = await first_step([run])
        events = ResponseEvents(builder, len(ids))
        # any error mid-stream is an error event, and the stream ends cleanly
        return stream_response(TYPED_EVENTS, _kept(events, first, run, keep), [run], lambda e: events.error(str(e)),
                               errors=(Exception,))
    try:
        steps = await steps_of(run)
    finally:
        await close([run])
    response = builder.response(builder.status(steps), builder.items(steps), usage(len(ids), steps))
    keep(response)
    return response


def _chat_request(body: ResponsesRequest, messages: list[dict], logprobs: int | None) -> ChatRequest:
    """The chat request this response is generated as: instructions as the first system message."""
    tools, choice = chat_tools(body.tools, body.tool_choice)
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    try:
        return ChatRequest.model_validate({
            "model": body.model, "messages": system + messages, "tools": tools or None,
            "tool_choice": choice if tools else None, "parallel_tool_calls": body.parallel_tool_calls,
            "max_completion_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
            "response_format": output_format(body.text), "logprobs": logprobs is not None, "top_logprobs": logprobs})
    except ValidationError as e:  # a field of ours in the chat route's terms: name the request's own
        error = e.errors()[0]
        field = CHAT_FIELDS.get(str(error["loc"][0]), str(error["loc"][0]))
        raise InvalidParameter(field, f"{field}: {error['msg']}") from None


def _echoed(body: ResponsesRequest) -> dict:
    """The request's settings as a response object repeats them."""
    return {"instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "top_p": 1.0 if body.top_p is None else body.top_p, "tools": body.tools or [],
            "tool_choice": body.tool_choice or "auto", "parallel_tool_calls": bool(body.parallel_tool_calls),
            "text": body.text or {"format": {"type": "text"}}, "metadata": body.metadata or {},
            "previous_response_id": body.previous_response_id, "store": body.store is not False,
            "truncation": body.truncation or "disabled", "reasoning": {"effort": None, "summary": None},
            "top_logprobs": body.top_logprobs or 0, "user": body.user, "max_tool_calls": body.max_tool_calls}


async def _kept(events: ResponseEvents, first, run: Run, keep):
    """The response's events; once the last is sent, the response is kept."""
    async for payload in stepped(events, first, run.steps):
        yield payload
    keep(events.final)
