"""The server's seams (issue 36): what the routes declare is what auth and /openapi.json do (open
routes, streams)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from starlette.routing import Mount

from nexttok.server import create_app
from nexttok.server.routing import STREAM_MEDIA, open_routes, routes_of, streaming_routes

KEY = "sk-seams"
OPEN = {"/health", "/", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/static"}


@pytest.fixture(scope="module")
def app(served):
    return create_app([served], api_key=KEY, start_schedulers=False)


@pytest.fixture(scope="module")
def spec(app):
    response = TestClient(app).get("/openapi.json")  # open: no key
    assert response.status_code == 200
    return response.json()


def _body_schema(spec: dict, operation: dict) -> dict:
    ref = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    return spec["components"]["schemas"][ref["$ref"].rsplit("/", 1)[-1]] if "$ref" in ref else ref


def test_every_route_that_can_stream_documents_its_stream(app, spec):
    """A body with a `stream` field streams: its 200 says in which media type, as the route declares."""
    streaming = streaming_routes(app.routes)
    can_stream = {path for path, operations in spec["paths"].items() for operation in operations.values()
                  if "stream" in _body_schema(spec, operation).get("properties", {})}
    can_stream.remove("/v1/messages/count_tokens")  # a message's body, stream and all: it counts, never streams
    assert can_stream == set(streaming) and {"/v1/responses", "/v1/chat/completions", "/api/pull"} <= can_stream
    for path, media in streaming.items():
        content = spec["paths"][path]["post"]["responses"]["200"]["content"]
        assert media in content and "application/json" in content, path
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            documented = set(operation["responses"].get("200", {}).get("content", {})) & set(STREAM_MEDIA)
            assert documented == ({streaming[path]} if path in streaming else set()), path
    assert streaming["/v1/responses"] == "text/event-stream" and streaming["/api/chat"] == "application/x-ndjson"


def _a_path(route) -> str:
    """A concrete path the route answers: each {param} (or {param:path}) as "x"."""
    path = route.path + "/x" if isinstance(route.original_route, Mount) else route.path
    return re.sub(r"\{[^}]+\}", "x", path)


def test_open_paths_are_the_routes_marked_open(app, spec):
    assert {route.path for route in open_routes(app)} == OPEN
    client = TestClient(app)
    for route in routes_of(app.routes):
        opened = route.path in OPEN
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            status = client.request(method, _a_path(route)).status_code
            assert (status != 401) == opened, (method, route.path, status)
    assert client.get("/redoc").status_code == 401 and client.get("/no/such/path").status_code == 401
    for path, operations in spec["paths"].items():  # the document says the same
        for operation in operations.values():
            assert ("401" not in operation["responses"]) == (path in OPEN), path
            assert (operation.get("security") == []) == (path in OPEN), path
    assert spec["security"] == [{"apiKey": []}]


def test_every_route_is_in_one_apis_table(spec):
    tags = {path: {tag for operation in operations.values() for tag in operation.get("tags", [])}
            for path, operations in spec["paths"].items()}
    assert all(len(found) == 1 for found in tags.values()), tags
    assert tags["/v1/responses"] == {"Responses"} and tags["/api/pull"] == {"Ollama"}
    assert tags["/v1/messages"] == {"Anthropic"} and tags["/explain/sessions"] == {"Explainer"}
    assert tags["/v1/chat/completions"] == {"OpenAI"} and tags["/health"] == {"Server"}
