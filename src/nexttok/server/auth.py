"""The API key: every path but the open ones needs `Authorization: Bearer KEY` when a key is set."""

from __future__ import annotations

import hmac

from fastapi import FastAPI, Request

from nexttok.server.errors import error_response

OPEN_PATHS = {"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/"}  # and /static/...


def needs_key(path: str) -> bool:
    """needs_key("/v1/models") -> True; needs_key("/health") -> False."""
    return path not in OPEN_PATHS and not path.startswith("/static/")


def install_api_key(app: FastAPI, api_key: str | None) -> None:
    """Refuse requests without the key (401); no key: everything is open."""
    if not api_key:
        return
    expected = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if needs_key(request.url.path):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):  # constant time
                return error_response(401, "Incorrect or missing API key (send Authorization: Bearer KEY)",
                                      code="invalid_api_key")
        return await call_next(request)
