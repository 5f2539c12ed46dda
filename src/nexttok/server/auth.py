"""The API key: every path but those of the open routes (routing.OPEN: /health, the page and its
static files, the API documentation) needs it when a key is set, sent as
`Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY` (Anthropic's)."""

from __future__ import annotations

import hmac

from fastapi import FastAPI, Request

from nexttok.server.errors import error_shape
from nexttok.server.routing import open_routes


def needs_key(app: FastAPI, path: str) -> bool:
    """Whether a request for path needs the key (any path no open route answers, unknown ones
    too): needs_key(app, "/v1/models") -> True; needs_key(app, "/health") -> False."""
    return not any(route.path_regex.match(path) for route in open_routes(app))


def bearer_token(authorization: str) -> str | None:
    """The token of a Bearer credential, the scheme matched in any case (RFC 7235 §2.1):
    bearer_token("bearer sk-1") -> "sk-1"; bearer_token("Basic dXNlcg==") -> None."""
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def given_keys(headers) -> list[str]:
    """The keys a request sends: its Bearer token and its x-api-key header, those present:
    given_keys({"x-api-key": "sk-1"}) -> ["sk-1"]."""
    keys = [bearer_token(headers.get("authorization", "")), headers.get("x-api-key", "").strip()]
    return [key for key in keys if key]


def install_api_key(app: FastAPI, api_key: str | None) -> None:
    """Refuse requests without the key (401, with the WWW-Authenticate challenge RFC 7235 requires);
    no key: everything is open. Either header may carry it."""
    if not api_key:
        return
    expected = api_key.encode()

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if not needs_key(request.app, request.url.path):
            return await call_next(request)
        keys = given_keys(request.headers)
        if any(hmac.compare_digest(key.encode(), expected) for key in keys):  # constant time
            return await call_next(request)
        shape = error_shape(request.app, request.url.path)
        if not keys:
            response = shape.response(401, "Missing API key: send the header Authorization: Bearer KEY "
                                      "or x-api-key: KEY", code="invalid_api_key")
            response.headers["WWW-Authenticate"] = "Bearer"
        else:
            response = shape.response(401, "Incorrect API key provided", code="invalid_api_key")
            response.headers["WWW-Authenticate"] = 'Bearer error="invalid_token"'  # RFC 6750 §3
        return response
