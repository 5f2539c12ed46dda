"""The OpenAI-compatible HTTP server (FastAPI).

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, POST /tokenize,
POST /detokenize, GET /health, GET /metrics. Errors use OpenAI's shape
{"error": {"message", "type", "param", "code"}}; client mistakes are 4xx, never 500.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from nexttok.chat import ChatTemplateError
from nexttok.errors import InvalidParameter
from nexttok.generate import Generation, Step, prompt_ids_for
from nexttok.sampling import SamplingParams
from nexttok.server import responses
from nexttok.server.engine import ServedModel
from nexttok.server.metrics import Metrics
from nexttok.server.scheduler import GenerationFailed, QueueFull, RequestTimeout, Scheduler, ShuttingDown
from nexttok.server.schemas import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    ErrorResponse,
    SamplingFields,
    TokenizeRequest,
)

OPEN_PATHS = {"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/"}


@asynccontextmanager
async def _lifespan(app: FastAPI):
    yield
    app.state.shutdown()  # ends every stream still open with a clean error event


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


def error_response(status: int, message: str, param=None, code=None, kind="invalid_request_error"):
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


@dataclass
class ServerLimits:
    max_running: int = 8  # requests decoded together in one batch, per model
    max_queue: int = 64  # requests waiting for a slot before new ones get 429
    request_timeout: float | None = 600.0  # seconds from arrival to the last token
    max_model_len: int | None = 4096  # prompt + completion; None: the model's own context
    batch_invariant: bool = True  # same tokens alone or in any batch (decode always runs max_running rows)
    max_body_bytes: int = 4 << 20  # larger request bodies get 413

    def __post_init__(self) -> None:
        for name in ("max_running", "max_queue"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {self.request_timeout!r}")
        if self.max_model_len is not None and (type(self.max_model_len) is not int or self.max_model_len < 2):
            raise ValueError(f"max_model_len must be an integer >= 2, got {self.max_model_len!r}")
        if type(self.max_body_bytes) is not int or self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be an integer >= 1024, got {self.max_body_bytes!r}")


def create_app(models: list[ServedModel], *, api_key: str | None = None,
               limits: ServerLimits | None = None, start_schedulers: bool = True) -> FastAPI:
    """The app; each model's batch scheduler starts in a thread of its own unless
    start_schedulers=False (then the caller runs one with scheduler.run(), see nexttok serve)."""
    if not models:
        raise ValueError("a server needs at least one model")
    limits = limits or ServerLimits()
    app = FastAPI(title="nexttok", version="0.1.0", lifespan=_lifespan,
                  description="OpenAI-compatible text generation, one token at a time.")
    app.state.models = {m.name: m for m in models}
    app.state.metrics = Metrics()
    app.state.limits = limits
    for served in models:
        context = served.model.config.max_position_embeddings
        served.scheduler = Scheduler(served.model, max_running=limits.max_running, max_queue=limits.max_queue,
                                     max_len=min(context, limits.max_model_len or context),
                                     timeout=limits.request_timeout, metrics=app.state.metrics,
                                     batch_invariant=limits.batch_invariant)
        if start_schedulers:
            served.scheduler.start()
    app.state.shutdown = lambda: [m.scheduler.stop() for m in models]
    app.state.request_stop = lambda: [m.scheduler.request_stop() for m in models]
    _install_errors(app)
    _install_auth(app, api_key)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    _install_routes(app)
    _install_generation_routes(app)
    from nexttok.server.explainer import install_explainer

    install_explainer(app, lambda name: _served(app, name))
    app.openapi = lambda: _openapi(app, api_key is not None)
    return app


ERROR_RESPONSES = {
    "400": "a parameter is invalid (the error names it as `param`) or the body is not valid JSON",
    "401": "the API key is missing or wrong",
    "404": "unknown model or explainer session",
    "413": "the request body is larger than the server accepts",
    "429": "the waiting line is full; retry after Retry-After seconds",
    "500": "generation failed inside the server",
    "503": "the server is shutting down",
    "504": "the request ran past the server's request timeout",
}
STREAMING_PATHS = ("/v1/completions", "/v1/chat/completions")


def _openapi(app: FastAPI, with_auth: bool) -> dict:
    """FastAPI's spec, with the responses this server really gives: OpenAI-shaped errors (never
    FastAPI's 422), and server-sent events for streaming requests."""
    if app.openapi_schema:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    error_schema = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(error_schema.pop("$defs", {}))
    components["ErrorResponse"] = error_schema
    error_content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for code, description in ERROR_RESPONSES.items():
                if code == "401" and (not with_auth or path in OPEN_PATHS):
                    continue
                responses[code] = {"description": description, "content": error_content}
            if path in STREAMING_PATHS:
                responses["200"].setdefault("content", {})["text/event-stream"] = {
                    "schema": {"type": "string", "description": "data: {chunk} lines, then data: [DONE]"}}
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    app.openapi_schema = schema
    return schema


class BodyTooLarge(StarletteHTTPException):
    """Raised while reading a body past the limit (an HTTPException, so FastAPI's body parsing
    passes it on instead of turning it into a 400)."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body is larger than {limit} bytes")


class BodyLimit:
    """Refuse request bodies over max_bytes: by Content-Length up front, or while reading."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                return await error_response(400, "Content-Length is not a number")(scope, receive, send)
            if int(declared) > self.max_bytes:
                return await _too_large(self.max_bytes)(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)


def _too_large(limit: int) -> JSONResponse:
    return error_response(413, BodyTooLarge(limit).detail, code="body_too_large")


# -- errors and auth ----------------------------------------------------------------------------


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return error_response(e.status, e.message, e.param, e.code, e.kind)

    @app.exception_handler(InvalidParameter)
    async def invalid_parameter(request: Request, e: InvalidParameter):
        return error_response(400, str(e), e.param, e.code)

    @app.exception_handler(QueueFull)
    async def queue_full(request: Request, e: QueueFull):
        response = error_response(429, f"server busy: {e}; retry shortly", code="queue_full",
                                  kind="rate_limit_error")
        response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(RequestTimeout)
    async def timeout(request: Request, e: RequestTimeout):
        return error_response(504, str(e), code="timeout", kind="timeout_error")

    @app.exception_handler(GenerationFailed)
    async def generation_failed(request: Request, e: GenerationFailed):
        return error_response(500, str(e), code="generation_failed", kind="server_error")

    @app.exception_handler(ShuttingDown)
    async def shutting_down(request: Request, e: ShuttingDown):
        return error_response(503, str(e), code="shutting_down", kind="server_error")

    @app.exception_handler(ChatTemplateError)
    async def chat_template(request: Request, e: ChatTemplateError):
        return error_response(400, str(e), "messages")

    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, e: RequestValidationError):
        message, param = _describe_validation(e.errors())
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        message = f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
        code = {404: "not_found", 413: "body_too_large"}.get(e.status_code)
        return error_response(e.status_code, message, code=code)


def _describe_validation(errors: list[dict]) -> tuple[str, str | None]:
    """One clear message from pydantic's list, naming the (top-level) parameter."""
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None
    kind = first.get("type")
    if kind == "json_invalid":
        return f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}", None
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {'.'.join(loc)}", param
    if kind == "missing":
        return f"Missing required parameter: {'.'.join(loc)}", param
    if kind in ("model_attributes_type", "model_type") and not loc:
        return "request body must be a JSON object", None
    # a union (e.g. stop: string or list) fails once per alternative: say them all
    same = [e.get("msg", "") for e in errors if [str(p) for p in e.get("loc", ()) if p != "body"][:1] == loc[:1]]
    reasons = "; or ".join(dict.fromkeys(same))
    return f"Invalid value for {param}: {reasons}", param


def _install_auth(app: FastAPI, api_key: str | None) -> None:
    if not api_key:
        return
    expected = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if request.url.path not in OPEN_PATHS and not request.url.path.startswith("/static/"):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):  # constant time
                return error_response(401, "Incorrect or missing API key (send Authorization: Bearer KEY)",
                                      code="invalid_api_key")
        return await call_next(request)


# -- routes -------------------------------------------------------------------------------------


def _install_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return app.state.metrics.prometheus()

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [responses.model_card(m) for m in app.state.models.values()]}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        served = _served(app, body.model)
        if (body.prompt is None) == (body.messages is None):
            raise InvalidParameter("prompt", "give exactly one of prompt or messages")
        if body.messages is not None:
            if served.chat_template is None:
                raise APIError(400, f"model {served.name!r} has no chat template", param="messages")
            text = served.chat_template.render(body.messages, add_generation_prompt=body.add_generation_prompt)
            ids = served.tokenizer.encode(text)
        else:
            ids = served.tokenizer.encode(body.prompt, add_special=body.add_special_tokens)
        return {"count": len(ids), "max_model_len": served.context_length, "tokens": ids,
                "token_strs": [p.text for p in served.tokenizer.pieces(ids)]}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        served = _served(app, body.model)
        try:
            return {"prompt": served.tokenizer.decode(body.tokens)}
        except ValueError as e:
            raise InvalidParameter("tokens", str(e)) from None


def _install_generation_routes(app: FastAPI) -> None:
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        served = _served(app, body.model)
        prompts = _completion_prompts(served, body.prompt)
        top_n = body.logprobs or 0
        plan = _plan(served, body, body.max_tokens if body.max_tokens is not None else 16)
        jobs = [(p, i * body.n + k) for i, p in enumerate(prompts) for k in range(body.n)]
        return await _respond(served, body, jobs, plan, top_n, responses.CompletionFormat(
            served.name, served.tokenizer, logprobs=body.logprobs is not None))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest):
        served = _served(app, body.model)
        if served.chat_template is None:
            raise APIError(400, f"model {served.name!r} has no chat template; use /v1/completions",
                           param="messages", code="no_chat_template")
        if body.top_logprobs is not None and not body.logprobs:
            raise InvalidParameter("top_logprobs", "top_logprobs requires logprobs to be true")
        text = served.chat_template.render(body.messages)
        ids = _prompt_ids(served, served.tokenizer.encode(text))
        top_n = (body.top_logprobs or 0) if body.logprobs else 0
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        plan = _plan(served, body, max_tokens)
        jobs = [(ids, k) for k in range(body.n)]
        return await _respond(served, body, jobs, plan, top_n, responses.ChatFormat(
            served.name, served.tokenizer, logprobs=body.logprobs, top_logprobs=body.top_logprobs or 0))


def _served(app: FastAPI, name: str | None) -> ServedModel:
    models = app.state.models
    if name is None and len(models) == 1:
        return next(iter(models.values()))
    if name not in models:
        raise APIError(404, f"The model {name!r} does not exist (served: {', '.join(models)})",
                       param="model", code="model_not_found")
    return models[name]


def _completion_prompts(served: ServedModel, prompt) -> list[list[int]]:
    """Token ids of each prompt (the schema bounds their number and rejects empty lists)."""
    if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt):
        prompt = [prompt]
    return [_prompt_ids(served, p) for p in prompt]


def _prompt_ids(served: ServedModel, prompt) -> list[int]:
    return prompt_ids_for(served.model, served.tokenizer, prompt, served.context_length)


def _plan(served: ServedModel, body: SamplingFields, max_tokens: int | None) -> dict:
    """Generation settings shared by every choice of the request. Ranges, counts and the form of
    logit_bias keys were checked by the request schema; what needs the model is checked here."""
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    bias = {int(key): value for key, value in (body.logit_bias or {}).items()}
    top_k = body.top_k if body.top_k not in (None, -1) else 0
    params = SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p, top_k=top_k,
        min_p=body.min_p or 0.0, presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        logit_bias=bias, seed=body.seed)
    if bias and max(bias) >= served.model.config.vocab_size:
        raise InvalidParameter("logit_bias", f"logit_bias token id {max(bias)} is outside the vocabulary")
    return {"params": params, "max_tokens": max_tokens, "stop": stop}


def _params_for_choice(params: SamplingParams, index: int) -> SamplingParams:
    """Choice i of a seeded request uses seed + i: distinct choices, each reproducible."""
    if params.seed is None or index == 0:
        return params
    return SamplingParams(**{**vars(params), "seed": (params.seed + index) % 2**63})


async def _respond(served, body, jobs, plan, top_n, fmt):
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream_options is not None and not body.stream:
        raise InvalidParameter("stream_options", "stream_options is only allowed when stream is true")
    runs = [(ids, index, served.scheduler.submit(_generation(served, ids, plan, index, top_n)))
            for ids, index in jobs]
    try:
        first = await runs[0][2].__anext__()  # errors before the first token become a 4xx/5xx response
        if not body.stream:
            return await _complete(runs, first, fmt)
    except BaseException:
        await _close(runs)
        raise
    return StreamingResponse(_sse(runs, first, fmt, include_usage), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _complete(runs, first: Step, fmt) -> dict:
    """All choices at once; they were submitted together, so they decode in one batch."""
    async def collect(n: int, steps) -> list[Step]:
        return [s async for s in _chain([first] if n == 0 else [], steps)]

    collected = await asyncio.gather(*(collect(n, steps) for n, (_, _, steps) in enumerate(runs)))
    usage = responses.Usage()
    choices = []
    for (ids, index, _), steps in zip(runs, collected, strict=True):
        choices.append(fmt.choice(index, steps))
        usage.add(len(ids), len(steps))
    return fmt.response(choices, usage)


def _generation(served, ids, plan, index, top_n) -> Generation:
    return Generation(served.model.config, served.tokenizer, ids, _params_for_choice(plan["params"], index),
                      max_tokens=plan["max_tokens"], stop=plan["stop"], top_n=top_n,
                      context_limit=served.context_length)


async def _close(runs) -> None:
    for _, _, steps in runs:
        await steps.aclose()


async def _sse(runs, first: Step, fmt, include_usage: bool) -> AsyncIterator[bytes]:
    usage = responses.Usage()
    try:
        for n, (ids, index, steps) in enumerate(runs):
            for chunk in fmt.start_chunks(index):
                yield _event(chunk, include_usage)
            count = 0
            pending = [first] if n == 0 else []
            async for step in _chain(pending, steps):
                count += 1
                chunk = fmt.step_chunk(index, step)
                if chunk is not None:
                    yield _event(chunk, include_usage)
            usage.add(len(ids), count)
        if include_usage:
            yield _event(fmt.usage_chunk(usage), False)
    except (ValueError, RequestTimeout, ShuttingDown, GenerationFailed) as e:  # say so, end cleanly
        kind = "timeout_error" if isinstance(e, RequestTimeout) else "server_error"
        yield _event({"error": {"message": str(e), "type": kind, "param": None, "code": None}}, False)
    finally:
        await _close(runs)
    yield b"data: [DONE]\n\n"


async def _chain(first: list[Step], rest: AsyncIterator[Step]) -> AsyncIterator[Step]:
    for step in first:
        yield step
        if step.finish_reason:
            return
    async for step in rest:
        yield step


def _event(payload: dict, include_usage: bool) -> bytes:
    if include_usage and "usage" not in payload:
        payload = {**payload, "usage": None}
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()
