"""nexttok's HTTP server: OpenAI-compatible routes over the same core as the CLI."""

from __future__ import annotations

from pathlib import Path

import uvicorn

from nexttok.loading import load_checkpoint
from nexttok.server.app import create_app
from nexttok.server.engine import ServedModel
from nexttok.server.limits import ServerLimits

__all__ = ["Server", "ServedModel", "ServerLimits", "create_app", "load_served", "serve_in_main_thread"]


class Server(uvicorn.Server):
    """uvicorn that, asked to exit, first ends every open stream cleanly (an error event, then
    [DONE]) so that shutting down never waits on a long generation."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"):
        super().__init__(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                        timeout_graceful_shutdown=10))
        self.app = app

    def handle_exit(self, sig, frame) -> None:
        self.app.state.shutdown()
        super().handle_exit(sig, frame)


def serve_in_main_thread(app, served: list[ServedModel], *, host: str, port: int, log_level: str) -> None:
    """Run the first model's scheduler in this (main) thread and uvicorn in another; Ctrl-C or
    SIGTERM end open streams cleanly, then exit. Requires create_app(..., start_schedulers=False)."""
    import signal
    import threading

    server = Server(app, host=host, port=port, log_level=log_level)
    http = threading.Thread(target=server.run, name="nexttok-http", daemon=True)
    for other in served[1:]:
        other.scheduler.start()

    def on_signal(sig, frame) -> None:
        app.state.request_stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    http.start()
    try:
        served[0].scheduler.run()
    finally:
        app.state.shutdown()
        server.should_exit = True
        http.join(timeout=30)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def load_served(source: str, name: str | None = None, *, dtype=None, device=None, compile=False) -> ServedModel:
    """Load a checkpoint for serving; its name defaults to the source as given (a path's folder name)."""
    checkpoint = load_checkpoint(source, dtype=dtype, device=device, compile=compile)
    path = Path(source)
    default_name = path.name if path.exists() else str(source)
    return ServedModel(name or default_name, checkpoint.model, checkpoint.tokenizer, checkpoint.chat_template)
