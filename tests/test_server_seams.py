"""The server's seams (issue 36): what the routes declare is what auth and /openapi.json do (open
routes, streams), and the server logs a line per request and every 5xx with its traceback."""

from __future__ import annotations

import logging
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


@pytest.fixture
def server_log(caplog, monkeypatch):
    """The records of the logger "nexttok.server", from INFO up (whatever a live server set it to)."""
    monkeypatch.setattr(logging.getLogger("nexttok.server"), "propagate", True)
    caplog.set_level(logging.INFO, logger="nexttok.server")
    return caplog


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


def _failing_app(served, error: Exception):
    app = create_app([served], start_schedulers=False)

    async def fail():
        raise error

    app.add_api_route("/v1/fail", fail, methods=["GET"])
    app.add_api_route("/api/fail", fail, methods=["GET"])
    return app


def test_a_request_line_for_every_request(served, server_log):
    client = TestClient(create_app([served], start_schedulers=False))
    assert client.get("/health").status_code == 200
    assert client.post("/v1/completions", json={"model": "nope", "prompt": "x"}).status_code == 404
    lines = [r.getMessage() for r in server_log.records if r.name == "nexttok.server" and r.levelno == logging.INFO]
    assert re.fullmatch(r"GET /health 200 \d+\.\d{3}s", lines[0]), lines
    assert lines[1].startswith("POST /v1/completions 404 "), lines


def test_an_unanswered_exception_is_a_logged_500_in_the_apis_shape(served, server_log):
    client = TestClient(_failing_app(served, RuntimeError("the disk caught fire")), raise_server_exceptions=False)
    response = client.get("/v1/fail")
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error" and "RuntimeError" in response.json()["error"]["message"]
    assert "fire" not in response.text  # the log has the details, not the client
    assert client.get("/api/fail").json() == {"error": "the server failed (RuntimeError); its log says where"}
    failed = [r for r in server_log.records if r.levelno == logging.ERROR]
    assert len(failed) == 2 and failed[0].getMessage() == "GET /v1/fail failed"
    assert failed[0].exc_info[1].args == ("the disk caught fire",) and "Traceback" in server_log.text
    assert "GET /v1/fail 500 " in server_log.text


def test_an_answered_5xx_is_logged_with_its_traceback(served, server_log):
    from nexttok.server.scheduler import GenerationFailed, RequestTimeout, ShuttingDown

    for error, status in ((ShuttingDown("going away"), 503), (RequestTimeout("too slow"), 504)):
        server_log.clear()
        response = TestClient(_failing_app(served, error)).get("/v1/fail")
        assert response.status_code == status
        logged = [r for r in server_log.records if r.levelno == logging.ERROR]
        assert len(logged) == 1 and logged[0].exc_info[1] is error, logged
        assert f"GET /v1/fail answered {status}" in logged[0].getMessage()
    server_log.clear()  # a failed generation: the scheduler logged it where it failed, not again here
    assert TestClient(_failing_app(served, GenerationFailed("the batch failed"))).get("/v1/fail").status_code == 500
    assert not [r for r in server_log.records if r.levelno == logging.ERROR]


def test_a_4xx_and_a_501_are_not_logged_as_failures(served, server_log):
    client = TestClient(create_app([served], start_schedulers=False))
    assert client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "top_p": 9}).status_code == 400
    assert client.post("/api/push", json={"model": "x"}).status_code == 501
    assert not [r for r in server_log.records if r.levelno >= logging.WARNING]


class _Steps:
    """A run's steps that only know whether they were closed."""

    closed = False

    async def aclose(self):
        self.closed = True


def _written(wire, error, fail: Exception, errors=None) -> tuple[bytes, bool]:
    """What the one writer sends for one event and then `fail`, and whether it closed the run."""
    import asyncio

    from nexttok.server.streaming import STREAM_ERRORS, Run, written

    async def events():
        yield {"type": "ping", "n": "é"}
        raise fail

    run = Run([1], 0, _Steps())

    async def collect():
        return b"".join([part async for part in written(wire, events(), [run], error, errors or STREAM_ERRORS)])
    return asyncio.run(collect()), run.steps.closed


def test_one_writer_frames_each_api_and_ends_an_error_its_way(server_log):
    from nexttok.server.anthropic import stream_error
    from nexttok.server.scheduler import GenerationFailed, RequestTimeout
    from nexttok.server.streaming import NDJSON_LINES, OPENAI_CHUNKS, TYPED_EVENTS, openai_stream_error

    sent, closed = _written(OPENAI_CHUNKS, openai_stream_error, RequestTimeout("late"))
    assert sent == (b'data: {"type": "ping", "n": "\xc3\xa9"}\n\ndata: {"error": {"message": "late", "type": '
                    b'"timeout_error", "param": null, "code": null}}\n\ndata: [DONE]\n\n') and closed
    sent, closed = _written(TYPED_EVENTS, stream_error, GenerationFailed("broke"))
    assert sent.endswith(b'event: error\ndata: {"type": "error", "error": {"type": "api_error", "message": "broke"}}'
                         b'\n\n') and sent.startswith(b"event: ping\n") and closed
    sent, closed = _written(NDJSON_LINES, lambda e: {"error": str(e)}, ValueError("bad"))
    assert sent == b'{"type": "ping", "n": "\xc3\xa9"}\n{"error": "bad"}\n' and closed
    failed = [r for r in server_log.records if r.levelno == logging.ERROR]
    assert [r.exc_info[0] for r in failed] == [RequestTimeout, ValueError]  # the scheduler logs a failed generation
    with pytest.raises(KeyError):  # not among the errors the API writes as an event: it propagates
        _written(NDJSON_LINES, lambda e: {"error": str(e)}, KeyError("x"), errors=(ValueError,))
