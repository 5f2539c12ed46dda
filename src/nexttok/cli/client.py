"""The CLI's side of a running `nexttok serve`: where it is ($NEXTTOK_HOST, as Ollama's OLLAMA_HOST),
whether one answers there, and JSON and server-sent events over the standard library's urllib.

    NEXTTOK_HOST=127.0.0.1:8000 (the default: serve's own), or host:port, or http(s)://host:port
    NEXTTOK_API_KEY: sent as the bearer key when set (serve requires it when it was started with one)
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator

DEFAULT_HOST = "127.0.0.1:8000"
PROBE_TIMEOUT = 0.5  # seconds: a server on this machine answers /api/version in milliseconds


class ServerError(OSError):
    """The server answered with an error; its message, in one line."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def host_and_port() -> tuple[str, int]:
    """$NEXTTOK_HOST as (host, port): host_and_port() == ("127.0.0.1", 8000) when it is unset."""
    text = (os.environ.get("NEXTTOK_HOST") or DEFAULT_HOST).strip()
    text = text.split("://", 1)[-1].rstrip("/")
    if text.startswith("["):  # [::1]:8000
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    host = host or "127.0.0.1"
    try:
        return host, int(port) if port else 8000
    except ValueError:
        raise ValueError(f"NEXTTOK_HOST={os.environ.get('NEXTTOK_HOST')!r} is not host:port") from None


def server_url() -> str:
    """The base URL of the configured server: server_url() == "http://127.0.0.1:8000"."""
    text = (os.environ.get("NEXTTOK_HOST") or "").strip()
    scheme = "https" if text.startswith("https://") else "http"
    host, port = host_and_port()
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def answering() -> bool:
    """Whether a nexttok server answers at server_url() (its /api/version names the engine; Ollama's,
    on the same port, would not)."""
    try:
        with _open("GET", "/api/version", None, PROBE_TIMEOUT) as response:
            return json.loads(response.read()).get("engine") == "nexttok"
    except (OSError, ValueError, AttributeError):
        return False


def get_json(path: str, timeout: float = 10.0) -> dict:
    with _open("GET", path, None, timeout) as response:
        return json.loads(response.read())


def post_json(path: str, body: dict, timeout: float | None = None) -> dict:
    with _open("POST", path, body, timeout) as response:
        return json.loads(response.read())


def post_events(path: str, body: dict, timeout: float | None = None) -> Iterator[dict]:
    """The data of each server-sent event of a streamed answer, until [DONE]; closing the iterator
    closes the connection (the server then stops generating)."""
    with _open("POST", path, body, timeout) as response:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            event = json.loads(data)
            if "error" in event and isinstance(event["error"], dict):
                raise ServerError(500, event["error"].get("message", "the server failed"))
            yield event


def _open(method: str, path: str, body: dict | None, timeout: float | None):
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    if os.environ.get("NEXTTOK_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['NEXTTOK_API_KEY']}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server_url() + path, data=data, method=method, headers=headers)
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise ServerError(e.code, _message(e)) from None


def _message(error: urllib.error.HTTPError) -> str:
    """The error's own words from its body (OpenAI's, Anthropic's or Ollama's shape)."""
    try:
        body = json.loads(error.read())
    except (OSError, ValueError):
        return f"{error.code} {error.reason}"
    found = body.get("error") if isinstance(body, dict) else None
    if isinstance(found, dict):
        found = found.get("message")
    return str(found or f"{error.code} {error.reason}")
