"""What the server tells its operator, through `logging` (the logger "nexttok.server"): one line per
request, once its answer is sent (method, path, status, seconds: a stream's whole length), and
every 5xx with its traceback. An exception no handler answered is logged here and becomes a 500 in
its API's error shape; a 5xx a handler answered is logged by errors.py, a failed generation by the
scheduler, an error ending a stream by streaming.py."""

from __future__ import annotations

import logging
import time

from nexttok.server.errors import error_shape

log = logging.getLogger("nexttok.server")


class RequestLog:
    """ASGI middleware, outermost: the request line of every request, and the unanswered exceptions."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        began, status = time.perf_counter(), None

        async def sending(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        method, path = scope["method"], scope["path"]
        try:
            await self.app(scope, receive, sending)
        except Exception as e:
            log.exception("%s %s failed", method, path)
            if status is not None:  # the answer has begun: it cannot become an error any more
                raise
            message = f"the server failed ({type(e).__name__}); its log says where"
            answer = error_shape(scope["app"], path).response(500, message, code="internal_error", kind="server_error")
            await answer(scope, receive, sending)
        finally:
            log.info("%s %s %s %.3fs", method, path, status, time.perf_counter() - began)


def logging_config(level: str) -> dict:
    """uvicorn's logging configuration with the server's logger beside its own, at `level` (the
    request line here replaces uvicorn's access line, which has no duration). It propagates, so
    that handlers on the root logger (pytest's caplog) see its records too."""
    from uvicorn.config import LOGGING_CONFIG

    config = {**LOGGING_CONFIG, "loggers": {**LOGGING_CONFIG["loggers"]}}
    config["loggers"]["nexttok.server"] = {"handlers": ["default"], "level": level.upper(), "propagate": True}
    return config
