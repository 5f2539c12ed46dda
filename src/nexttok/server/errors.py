"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, and the handlers that
turn every exception a request can raise into one (client mistakes are 4xx, never 500). Another
API's routes (Anthropic's /v1/messages, Ollama's /api) answer in that API's own shape: each
registers an ErrorShape for its paths in app.state.error_shapes, and every handler here writes in
the shape of the path it answers. A 5xx is logged with the traceback of its exception (but a 501,
which says a route is not available, a full waiting line, which is load, not a failure, and a
failed generation, which the scheduler logs)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from nexttok.errors import InvalidParameter
from nexttok.generation.grammar import MAX_SCHEMA_DEPTH
from nexttok.server.scheduler import GenerationFailed, QueueFull, RequestTimeout, ShuttingDown
from nexttok.server.schemas import ErrorResponse
from nexttok.tokenizers.chat_template import ChatTemplateError

log = logging.getLogger("nexttok.server")


class APIError(Exception):
    """A request the server refuses, with the HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


@dataclass(frozen=True)
class ErrorShape:
    """How one API writes an error: its body from (status, message, param, code, OpenAI's type),
    the status it answers with where that differs (statuses: Anthropic says 529 where OpenAI says
    429), and the body's schema for /openapi.json. full_location: an invalid value is named by
    where it is, options.temperature or messages[0].role (an API whose body has no `param` to
    point at, and whose schemas have no unions, so every part of a location is a name)."""

    body: Callable[[int, str, str | None, str | None, str], dict]
    schema: type[BaseModel]
    statuses: Mapping[int, int] = field(default_factory=dict)
    full_location: bool = False

    def status(self, status: int) -> int:
        return self.statuses.get(status, status)

    def response(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> JSONResponse:
        status = self.status(status)
        return JSONResponse(self.body(status, message, param, code, kind), status_code=status)


def openai_error(status: int, message: str, param: str | None, code: str | None, kind: str) -> dict:
    """openai_error(404, "no such model", "model", None, "invalid_request_error")
    -> {"error": {"message": "no such model", "type": "invalid_request_error", "param": "model", "code": None}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


OPENAI_ERRORS = ErrorShape(openai_error, ErrorResponse)


def error_shape(app, path: str) -> ErrorShape:
    """The shape of errors on `path`: that of the API whose prefix it has (app.state.error_shapes:
    {"/v1/messages": ...}), else OpenAI's."""
    for prefix, shape in getattr(app.state, "error_shapes", {}).items():
        if path == prefix or path.startswith(prefix + "/"):
            return shape
    return OPENAI_ERRORS


def request_error(request: Request, status: int, message: str, param: str | None = None, code: str | None = None,
                  kind: str = "invalid_request_error", cause: BaseException | None = None) -> JSONResponse:
    """An error response in the shape of the API the request went to; a 5xx (not 501) is logged
    with the traceback of its cause."""
    response = error_shape(request.app, request.url.path).response(status, message, param, code, kind)
    if cause is not None and response.status_code >= 500 and response.status_code != 501:
        log.error("%s %s answered %d: %s", request.method, request.url.path, response.status_code, message,
                  exc_info=cause)
    return response


def install_error_handlers(app: FastAPI) -> None:
    """Every exception a route can raise, as an error response in its API's shape (OpenAI's but
    where another API registered its paths)."""
    _install_request_errors(app)
    _install_scheduler_errors(app)


def _install_request_errors(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return request_error(request, e.status, e.message, e.param, e.code, e.kind, cause=e)

    @app.exception_handler(InvalidParameter)
    async def invalid_parameter(request: Request, e: InvalidParameter):
        return request_error(request, 400, str(e), e.param, e.code)

    @app.exception_handler(ChatTemplateError)
    async def chat_template(request: Request, e: ChatTemplateError):
        return request_error(request, 400, str(e), "messages")

    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, e: RequestValidationError):
        shape = error_shape(request.app, request.url.path)
        message, param = describe_validation(e.errors(), request.headers.get("content-type"), shape.full_location)
        return shape.response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        message = f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
        if isinstance(e.__cause__, RecursionError):  # FastAPI's "error parsing the body" says only that
            message = (f"request body is nested too deeply to read (a JSON schema in it may nest "
                       f"{MAX_SCHEMA_DEPTH} levels)")
        code = {404: "not_found", 413: "body_too_large"}.get(e.status_code)
        return request_error(request, e.status_code, message, code=code, cause=e)


def _install_scheduler_errors(app: FastAPI) -> None:
    @app.exception_handler(QueueFull)
    async def queue_full(request: Request, e: QueueFull):
        response = request_error(request, 429, f"server busy: {e}; retry shortly", code="queue_full",
                                 kind="rate_limit_error")
        response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(RequestTimeout)
    async def timeout(request: Request, e: RequestTimeout):
        return request_error(request, 504, str(e), code="timeout", kind="timeout_error", cause=e)

    @app.exception_handler(GenerationFailed)
    async def generation_failed(request: Request, e: GenerationFailed):
        # logged by the scheduler already, with the traceback of where the generation failed
        return request_error(request, 500, str(e), code="generation_failed", kind="server_error")

    @app.exception_handler(ShuttingDown)
    async def shutting_down(request: Request, e: ShuttingDown):
        return request_error(request, 503, str(e), code="shutting_down", kind="server_error", cause=e)


def describe_validation(errors: list[dict], content_type: str | None = None,
                        full_location: bool = False) -> tuple[str, str | None]:
    """One clear message from pydantic's list, naming the (top-level) parameter:
    [{"type": "missing", "loc": ("body", "prompt")}] -> ("Missing required parameter: prompt", "prompt").
    full_location: an invalid value is named by its whole location (ErrorShape.full_location)."""
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None
    kind = first.get("type")
    if kind == "json_invalid":
        return f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}", None
    if not loc and tuple(first.get("loc", ()))[:1] == ("body",):
        return describe_body_error(first, content_type), None
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {'.'.join(loc)}", param
    if kind == "missing":
        return f"Missing required parameter: {'.'.join(loc)}", param
    if full_location:
        given = repr(first.get("input"))
        given = given if len(given) <= 60 else given[:57] + "..."  # a long value would drown the message
        return f"Invalid value for {location(first['loc'])}: {first.get('msg', '')}, got {given}", param
    # a union (e.g. stop: string or list) fails once per alternative: say them all
    same = [e.get("msg", "") for e in errors if [str(p) for p in e.get("loc", ()) if p != "body"][:1] == loc[:1]]
    reasons = "; or ".join(dict.fromkeys(same))
    return f"Invalid value for {param}: {reasons}", param


def location(loc) -> str:
    """location(("body", "messages", 0, "role")) -> "messages[0].role"."""
    text = ""
    for part in loc:
        if part == "body" and not text:
            continue
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def describe_body_error(error: dict, content_type: str | None) -> str:
    """What is wrong with a body that failed as a whole. FastAPI parses JSON only under a JSON
    content type and hands anything else over as bytes, so bytes mean the header, not the JSON:
    describe_body_error({"type": "model_attributes_type", "input": b"{}"}, "text/plain")
    -> "Content-Type must be application/json, got text/plain"."""
    if error.get("type") == "missing":
        return "request body is empty: send a JSON object with Content-Type: application/json"
    if isinstance(error.get("input"), bytes):
        return f"Content-Type must be application/json, got {content_type or 'none'}"
    return "request body must be a JSON object"
