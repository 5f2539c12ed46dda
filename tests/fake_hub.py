"""A local stand-in for the Hugging Face hub's file API (what HF_ENDPOINT points at), never the network.

    GET /api/models/ORG/REPO/revision/main?blobs=true   the files, sizes and LFS sha256s (HfApi.model_info)
    GET|HEAD /ORG/REPO/resolve/REV/PATH                 302 to localhost:PORT/cdn/SHA256 (another host, as the hub's CDN)
    GET /cdn/SHA256                                     the bytes, with Range (206)

Knobs a test turns: cut (the next responses stop after that many bytes), corrupt (the bytes served
differ from the listed sha256), ignore_range; `requests` records (path, Range header) of each GET."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos
        self.cut: list[int] = []  # byte counts after which the next responses stop, one per response
        self.corrupt = False
        self.ignore_range = False
        self.requests: list[tuple[str, str | None]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.cdn = f"http://localhost:{self.server.server_address[1]}"  # another host, as the hub's CDN is

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def blob(self, sha256: str) -> bytes | None:
        for files in self.repos.values():
            for data in files.values():
                if hashlib.sha256(data).hexdigest() == sha256:
                    return data
        return None

    def downloads(self) -> list[str | None]:
        """The Range header of each request for a file's bytes (None: from the start)."""
        return [r for path, r in self.requests if path.startswith("/cdn/")]

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.do_GET(body=False)

            def do_GET(self, body: bool = True):
                hub.requests.append((self.path, self.headers.get("Range")))
                path = self.path.split("?", 1)[0]
                if path.startswith("/api/models/"):
                    return self._listing(path.removeprefix("/api/models/"))
                if path.startswith("/cdn/"):
                    return self._bytes(path.removeprefix("/cdn/"), body)
                parts = path.lstrip("/").split("/", 4)
                if len(parts) == 5 and parts[2] == "resolve":
                    repo = next((r for r in hub.repos if r.lower() == f"{parts[0]}/{parts[1]}".lower()), "")
                    data = hub.repos.get(repo, {}).get(parts[4])
                    if data is not None:
                        sha256 = hashlib.sha256(data).hexdigest()
                        self.send_response(302)  # with the headers huggingface_hub's HEAD reads
                        self.send_header("Location", f"{hub.cdn}/cdn/{sha256}")
                        self.send_header("X-Repo-Commit", COMMIT)
                        self.send_header("X-Linked-Etag", f'"{sha256}"')
                        self.send_header("ETag", f'"{sha256}"')
                        self.send_header("X-Linked-Size", str(len(data)))
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return None
                self._json(404, {"error": "Entry not found"})
                return None

            def _listing(self, rest: str):
                repo, _, revision = rest.partition("/revision/")
                repo = next((r for r in hub.repos if r.lower() == repo.lower()), repo)  # ids match in any case
                if repo not in hub.repos:
                    return self._json(401, {"error": "Repository not found"})
                siblings = [{"rfilename": "README.md"}]
                for name, data in sorted(hub.repos[repo].items()):
                    siblings.append({"rfilename": name, "size": len(data), "blobId": "x" * 40, "lfs": {
                        "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}})
                return self._json(200, {"id": repo, "sha": COMMIT, "siblings": siblings})

            def _bytes(self, sha256: str, body: bool):
                data = hub.blob(sha256)
                if data is None:
                    return self._json(404, {"error": "no such blob"})
                if hub.corrupt:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                start = 0
                ranged = self.headers.get("Range")
                if ranged and not hub.ignore_range:
                    start = int(ranged.removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.end_headers()
                        return None
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if not body:
                    return None
                chunk = data[start:]
                if hub.cut:
                    chunk = chunk[:hub.cut.pop(0)]
                self.wfile.write(chunk)
                self.wfile.flush()
                if len(chunk) < len(data) - start:
                    self.close_connection = True
                return None

            def _json(self, status: int, payload: dict):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
