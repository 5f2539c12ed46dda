"""nexttok's HTTP server: OpenAI-compatible routes over the same core as the CLI."""

from __future__ import annotations

import socket

import uvicorn

from nexttok.server.app import create_app
from nexttok.server.engine import ServedModel, load_served
from nexttok.server.limits import ServerLimits
from nexttok.server.logs import logging_config

__all__ = ["Server", "ServedModel", "ServerLimits", "create_app", "load_served", "serve_in_main_thread"]


class Server(uvicorn.Server):
    """uvicorn that, asked to exit, first ends every open stream cleanly (an error event, then
    [DONE]) so that shutting down never waits on a long generation."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"):
        super().__init__(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                        log_config=logging_config(log_level), access_log=False,
                                        timeout_graceful_shutdown=10))
        self.app = app

    def handle_exit(self, sig, frame) -> None:
        self.app.state.shutdown()
        super().handle_exit(sig, frame)


def serve_in_main_thread(app, served: list[ServedModel], *, host: str, port: int, log_level: str,
                         sock: socket.socket | None = None) -> None:
    """Run the first model's scheduler in this (main) thread and uvicorn in another; Ctrl-C or
    SIGTERM end open streams cleanly, then exit. Requires create_app(..., start_schedulers=False).
    sock: a socket already bound to host:port (None: uvicorn binds it). When uvicorn cannot start,
    or stops on its own, the schedulers stop too and OSError says so: no process left scheduling
    for nobody."""
    import signal
    import threading

    server = Server(app, host=host, port=port, log_level=log_level)
    ended: list[str] = []
    http = threading.Thread(target=_run_http, args=(server, sock, ended), name="nexttok-http", daemon=True)
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
    if ended:
        raise OSError(f"the HTTP server on {host}:{port} {ended[0]}")


def _run_http(server: Server, sock: socket.socket | None, ended: list[str]) -> None:
    """uvicorn, until told to exit. When it gives up instead (a port it cannot bind, a failed
    startup: SystemExit, after logging why), `ended` says so and the schedulers stop, which ends
    the main thread. (Not server.should_exit: the app's own shutdown has set it by then.)"""
    try:
        server.run(sockets=None if sock is None else [sock])
    except SystemExit:
        ended.append("could not start (uvicorn's error above)")
    except Exception as e:
        ended.append(f"{'stopped' if server.started else 'could not start'} ({type(e).__name__}: {e})")
    if ended:
        server.app.state.shutdown()
