"""A real server for tests: uvicorn in a background thread on 127.0.0.1, on a free port."""

from __future__ import annotations

import threading
import time

from nexttok.server import Server


class LiveServer:
    def __init__(self, app):
        self.server = Server(app, host="127.0.0.1", port=0, log_level="warning")
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """As on Ctrl-C: open streams end cleanly, then the server exits."""
        self.server.handle_exit(None, None)
        self.thread.join(timeout=30)
