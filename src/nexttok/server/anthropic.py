"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API over the chat
route's generation path, so the official `anthropic` client works unchanged.

A request becomes a chat request (anthropic_messages.py: system prompt, turns, tools), then the
chat route's prompt and plan (chat_plan: the chat template, tools as the grammar stage), one
generation on the model's scheduler, and a `message` with content blocks, or, with stream,
Anthropic's events (anthropic_stream.py). count_tokens renders the same prompt and counts it.

Errors on these paths are in Anthropic's shape, {"type": "error", "error": {"type", "message"}},
with Anthropic's statuses (a full waiting line is 529 overloaded_error, not 429).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, ValidationError

from nexttok.errors import InvalidParameter
from nexttok.generation.parameters import OPENAI_STOP_STRINGS
from nexttok.generation.tools import MAX_TOOLS
from nexttok.server.anthropic_messages import Reply, chat_messages, chat_tools, output_format
from nexttok.server.anthropic_stream import MessageEvents
from nexttok.server.completions import chat_plan, chat_prompt
from nexttok.server.engine import ServedModel
from nexttok.server.errors import ErrorShape
from nexttok.server.routing import EVENTS, streams
from nexttok.server.scheduler import RequestTimeout
from nexttok.server.schemas import ChatRequest, StopStrings, Strict, bounded
from nexttok.server.streaming import TYPED_EVENTS, Run, close, first_step, stepped, steps_of, stream_response

MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
EVENT_STREAM = streams(EVENTS, "Anthropic's events: event: {type} and data: {event} lines, ending with message_stop")
# the chat request's fields that come from differently named fields here
CHAT_FIELDS = {"stop": "stop_sequences", "response_format": "output_config"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 504: "timeout_error",
               529: "overloaded_error"}


class MessagesRequest(Strict):
    """Every field of Anthropic's MessageCreateParams, and the sampling fields its API takes; those
    that mean nothing here are accepted (the README's table says which)."""

    model: str
    messages: Annotated[list[Any], Field(min_length=1)]
    max_tokens: int = Field(ge=1, description="required, as Anthropic requires it; capped by the context window")
    system: str | list[Any] | None = Field(None, description="a string or text blocks: the first system message")
    stop_sequences: StopStrings | None = Field(None, description=OPENAI_STOP_STRINGS.allowed())
    temperature: float | None = bounded("temperature", le=1.0)
    top_p: float | None = bounded("top_p")
    top_k: int | None = bounded("top_k")
    tools: Annotated[list[Any], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_choice: dict[str, Any] | None = Field(None, description="auto, any, tool (with name) or none")
    stream: bool = False
    output_config: dict[str, Any] | None = Field(None, description="format (json_schema): the grammar stage; "
                                                                   "effort accepted, no effect")
    metadata: dict[str, Any] | None = Field(None, description="accepted, unused")
    thinking: dict[str, Any] | None = Field(None, description="accepted; these models do not reason apart")
    cache_control: dict[str, Any] | None = Field(None, description="accepted; the prefix cache reuses prompt "
                                                                   "prefixes by itself")
    container: Any = Field(None, description="refused: no code-execution containers here")
    diagnostics: dict[str, Any] | None = Field(None, description="accepted, nothing reported")
    inference_geo: str | None = Field(None, description="accepted; this machine")
    service_tier: str | None = Field(None, description="accepted; one tier")
    speed: str | None = Field(None, description="accepted; one speed")
    user_profile_id: str | None = Field(None, description="accepted, ignored")
    workspace_id: str | None = Field(None, description="accepted, ignored")


class CountTokensRequest(MessagesRequest):
    """The same body as a message's (max_tokens optional; the generation fields change nothing)."""

    max_tokens: int | None = Field(None, ge=1, description="optional here; no effect")


class AnthropicErrorBody(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error shape, used for every 4xx and 5xx of /v1/messages."""

    type: Literal["error"]
    error: AnthropicErrorBody


def anthropic_error(status: int, message: str, param: str | None, code: str | None, kind: str) -> dict:
    """anthropic_error(404, "no such model", "model", None, "invalid_request_error")
    -> {"type": "error", "error": {"type": "not_found_error", "message": "no such model"}}."""
    default = "invalid_request_error" if status < 500 else "api_error"
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, default), "message": message}}


ANTHROPIC_ERRORS = ErrorShape(anthropic_error, AnthropicErrorResponse, statuses={429: 529})

router = APIRouter()


@router.post(MESSAGES, responses=EVENT_STREAM)
async def create_message(body: MessagesRequest, request: Request):
    return await _create(await request.app.state.pool.get(body.model), body)


@router.post(COUNT_TOKENS)
async def count_tokens(body: CountTokensRequest, request: Request):
    """The prompt's tokens as /v1/messages renders it (tools included), counted without generating."""
    served = await request.app.state.pool.get(body.model)
    return {"input_tokens": len(chat_prompt(served, chat_request(body))[0])}


def chat_request(body: MessagesRequest) -> ChatRequest:
    """The chat request this message is generated as."""
    if body.container is not None:
        raise InvalidParameter("container", "container is not available: no code-execution containers here")
    tools, choice, parallel = chat_tools(body.tools, body.tool_choice)
    response_format = output_format(body.output_config)
    if response_format is not None and tools is not None and choice != "none":
        raise InvalidParameter("output_config", "output_config.format cannot be combined with tools "
                               "(tool inputs already follow their input_schema)")
    try:
        return ChatRequest.model_validate({
            "model": body.model, "messages": chat_messages(body.system, body.messages), "tools": tools,
            "tool_choice": choice, "parallel_tool_calls": parallel, "max_tokens": body.max_tokens,
            "stop": body.stop_sequences, "temperature": body.temperature, "top_p": body.top_p,
            "top_k": body.top_k, "response_format": response_format})
    except ValidationError as e:  # a field of ours in the chat route's terms: name the request's own
        error = e.errors()[0]
        field = CHAT_FIELDS.get(str(error["loc"][0]), str(error["loc"][0]))
        raise InvalidParameter(field, f"{field}: {error['msg']}") from None


async def _create(served: ServedModel, body: MessagesRequest):
    ids, plan, tools = chat_plan(served, chat_request(body))
    try:
        generation = plan.generation(served, ids, 0)
    except InvalidParameter as e:
        if e.param != "response_format":  # the grammar stage: a schema it cannot compile
            raise
        field = "tools" if tools else "output_config"
        raise InvalidParameter(field, f"{field}: {e}") from None
    reply = Reply(served.name, bool(tools), generation)
    run = Run(ids, 0, served.scheduler.submit(generation))
    if body.stream:
        first = await first_step([run])
        return stream_response(TYPED_EVENTS, stepped(MessageEvents(reply, len(ids)), first, run.steps), [run],
                               stream_error)
    try:
        steps = await steps_of(run)
    finally:
        await close([run])
    return reply.whole(steps, len(ids))


def stream_error(e: Exception) -> dict:
    """An error in the middle of a message's stream, as Anthropic's error event."""
    return anthropic_error(504 if isinstance(e, RequestTimeout) else 500, str(e), None, None, "")
