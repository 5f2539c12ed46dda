"""The OpenAPI spec of the responses this server really gives: each API's own error shape (OpenAI's,
Anthropic's and Ollama's on their routes; never FastAPI's 422) and, with an API key, the key
every route needs but the open ones. Each streaming route declares its stream itself (server-sent
events; Ollama's: NDJSON), as its 200 response's content (routing.streams)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from nexttok.server.auth import needs_key
from nexttok.server.errors import OPENAI_ERRORS, ErrorShape, error_shape

ERROR_RESPONSES = {
    "400": "a parameter is invalid (the error names it), or the body is empty, not valid JSON or "
           "not sent as Content-Type: application/json",
    "401": "the API key is missing or wrong",
    "404": "unknown model or explainer session",
    "413": "the request body is larger than the server accepts",
    "429": "the waiting line is full; retry after Retry-After seconds",
    "500": "generation failed inside the server",
    "503": "the server is shutting down",
    "504": "the request ran past the server's request timeout",
}


def openapi_spec(app: FastAPI, with_auth: bool) -> dict:
    """FastAPI's spec with the error responses and the API key put right (built once per app)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for shape in [OPENAI_ERRORS, *getattr(app.state, "error_shapes", {}).values()]:
        error_schema = shape.schema.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(error_schema.pop("$defs", {}))
        components[shape.schema.__name__] = error_schema
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            keyed = with_auth and needs_key(app, path)
            _fix_responses(operation.setdefault("responses", {}), keyed, error_shape(app, path))
    if with_auth:  # the key, as OpenAI's clients send it (Anthropic's x-api-key is taken too)
        schema["components"]["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
        schema["security"] = [{"apiKey": []}]
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    app.openapi_schema = schema
    return schema


def _fix_responses(responses: dict, keyed: bool, shape: ErrorShape) -> None:
    """One operation's responses: the errors it can give instead of 422, in its API's shape and
    statuses (a route's own 5xx too: Ollama's 501s); 401 where it needs the key."""
    error_content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{shape.schema.__name__}"}}}
    responses.pop("422", None)
    written: set[str] = set()
    for code, description in ERROR_RESPONSES.items():
        if code == "401" and not keyed:
            continue
        status = str(shape.status(int(code)))
        if status in written:  # two causes one status in this API (Ollama's 503: busy or shutting down)
            description = f"{responses[status]['description']}; or {description}"
        responses[status] = {"description": description, "content": error_content}
        written.add(status)
    for code in responses:
        if code.startswith("5") and code not in ERROR_RESPONSES:  # a route's own, declared without a body
            responses[code]["content"] = error_content
