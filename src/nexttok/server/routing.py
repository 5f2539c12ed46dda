"""What a route declares about itself, so that nothing else keeps a list of paths: whether it
streams (its 200 response's content names the stream's media type, which /openapi.json shows as
declared) and whether it is open (OpenAPI's `security: []` on the operation: no API key needed).
auth.py and openapi.py read both off the app's routes; app.py includes one route table
(an APIRouter) per API."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from fastapi.staticfiles import StaticFiles
from starlette.routing import BaseRoute, Mount

EVENTS = "text/event-stream"  # server-sent events: OpenAI's, the Responses API's and Anthropic's streams
NDJSON = "application/x-ndjson"  # one JSON object a line: Ollama's streams
STREAM_MEDIA = (EVENTS, NDJSON)
OPEN = {"security": []}  # a route's openapi_extra: anyone may call it, with or without the API key
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def streams(media: str, holds: str, answers: dict | None = None) -> dict:
    """The `responses` of a route that streams (answers: its other responses, by status):
    streams(EVENTS, "data: lines") -> {200: {"content": {"text/event-stream": {"schema":
    {"type": "string", "description": "data: lines"}}}}}."""
    answers = dict(answers or {})
    answers[200] = {**answers.get(200, {}), "content": {media: {"schema": {"type": "string", "description": holds}}}}
    return answers


def routes_of(routes: Sequence[BaseRoute]) -> list[RouteContext]:
    """Every route, those of included route tables as included (their prefix, tags and responses):
    FastAPI keeps an included table as one entry of app.routes."""
    return list(iter_route_contexts(routes))


def stream_media(route: RouteContext) -> str | None:
    """The media type a route streams in, as it declares it (None: it does not stream)."""
    if not isinstance(route.original_route, APIRoute):
        return None
    content = (route.responses or {}).get(200, {}).get("content", {})
    return next((media for media in content if media in STREAM_MEDIA), None)


def streaming_routes(routes: Sequence[BaseRoute]) -> dict[str, str]:
    """{path: media type} of the routes that stream."""
    return {route.path: media for route in routes_of(routes) if (media := stream_media(route)) is not None}


def is_open(route: RouteContext, docs: set[str]) -> bool:
    """A route anyone may call: one declared OPEN, the page's static files, FastAPI's own
    documentation pages (docs: their paths)."""
    if isinstance(route.original_route, APIRoute):
        return (route.openapi_extra or {}).get("security") == []
    if isinstance(route.original_route, Mount):
        return isinstance(route.original_route.app, StaticFiles)
    return route.path in docs


def open_routes(app) -> list[RouteContext]:
    """The app's open routes (FastAPI's /openapi.json, /docs and its OAuth2 redirect are open;
    /redoc is not)."""
    docs = {app.openapi_url, app.docs_url, app.swagger_ui_oauth2_redirect_url} - {None}
    return [route for route in routes_of(app.routes) if is_open(route, docs)]
