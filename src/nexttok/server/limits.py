"""What the server lets in: its limits (batch, waiting line, timeout, context, body size), the
middleware that refuses request bodies over the size limit, and the check that a JSON body's text
is Unicode."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from nexttok.generation.prefill import BLOCK
from nexttok.server.errors import APIError, ErrorShape, error_shape


@dataclass
class ServerLimits:
    max_running: int = 8  # requests decoded together in one batch, per model
    max_queue: int = 64  # requests waiting for a slot before new ones get 429
    request_timeout: float | None = 600.0  # seconds from arrival to the last token
    max_model_len: int | None = 4096  # prompt + completion; None: the model's own context
    batch_invariant: bool = True  # same tokens alone or in any batch (decode always runs max_running rows)
    max_body_bytes: int = 4 << 20  # larger request bodies get 413
    # keys and values of recent prompts kept for reuse (prefix_cache.py), in tokens, per model; 0 = off
    prefix_cache_tokens: int = 8192
    keep_alive: float | None = 300.0  # seconds a model loaded on demand stays once idle; None: forever
    max_loaded: int = 3  # models loaded on demand at once (those the server started with not counted)

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
        if type(self.max_loaded) is not int or self.max_loaded < 1:
            raise ValueError(f"max_loaded must be an integer >= 1, got {self.max_loaded!r}")
        if self.keep_alive is not None and not self.keep_alive >= 0:
            raise ValueError(f"keep_alive must be >= 0 seconds or None (forever), got {self.keep_alive!r}")
        tokens = self.prefix_cache_tokens
        if type(tokens) is not int or not (tokens == 0 or tokens >= BLOCK):
            raise ValueError(f"prefix_cache_tokens must be 0 (off) or an integer >= {BLOCK} (one block), "
                             f"got {tokens!r}")


class BodyTooLarge(StarletteHTTPException):
    """Raised while reading a body past the limit (an HTTPException, so FastAPI's body parsing
    passes it on instead of turning it into a 400)."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body is larger than {limit} bytes")


class BodyLimit:
    """ASGI middleware: refuse request bodies over max_bytes, by Content-Length up front or while reading."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            shape = error_shape(scope["app"], scope["path"])  # the shape of the API the path is in
            if not declared.isdigit():
                return await shape.response(400, "Content-Length is not a number")(scope, receive, send)
            if int(declared) > self.max_bytes:
                return await _too_large(self.max_bytes, shape)(scope, receive, send)
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


def _too_large(limit: int, shape: ErrorShape) -> JSONResponse:
    return shape.response(413, BodyTooLarge(limit).detail, code="body_too_large")


async def json_text_is_unicode(request: Request) -> None:
    """A dependency of every route: JSON may escape half a surrogate pair ("\\ud800"), which
    Python's json reads into a str that no tokenizer or encoder can take; refuse it as a 400
    naming where it is, before any route sees it."""
    if request.method not in ("POST", "PUT", "PATCH") or not _may_hold_a_surrogate(await request.body()):
        return
    try:
        body = await request.json()
    except ValueError:  # not JSON: the route's own parsing says so
        return
    found = lone_surrogate(body)
    if found is not None:
        path, char = found
        raise APIError(400, f"{path or 'request body'}: text contains a lone surrogate {char!r} (half of a "
                       "UTF-16 pair): it is not valid Unicode", param=re.split(r"[.\[]", path)[0] or None,
                       code="invalid_unicode")


def _may_hold_a_surrogate(body: bytes) -> bool:
    return b"\\ud" in body or b"\\uD" in body


def lone_surrogate(value, path: str = "") -> tuple[str, str] | None:
    """Where in a JSON value the first lone surrogate is (keys included), and which:
    lone_surrogate({"messages": [{"content": "a\\ud800"}]}) == ("messages[0].content", "\\ud800")."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return path, value[e.start]
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, int):
            inner = f"{path}[{key}]"
        else:
            name = key.encode("utf-8", "backslashreplace").decode()  # the path is sent back: keep it Unicode
            inner = f"{path}.{name}" if path else name
            if name != key:
                return inner, lone_surrogate(key)[1]
        found = lone_surrogate(item, inner)
        if found is not None:
            return found
    return None
