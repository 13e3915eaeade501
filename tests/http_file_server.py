"""A real HTTP server for tests that download (VM images from a URL): the standard library's, on
127.0.0.1 port 0, serving `routes` (path -> (status, body or file, headers)) and recording each
request's path. `gate` cleared makes bodies wait (a slow server)."""

from __future__ import annotations

import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Body = bytes | Path


class FileServer:
    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, Body, dict[str, str]]] = {}
        self.requests: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.path)
                status, body, headers = server.routes.get(self.path, (404, b"not here", {}))
                size = body.stat().st_size if isinstance(body, Path) else len(body)
                self.send_response(status)
                for k, v in {"Content-Length": str(size), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                server.gate.wait(30)
                if isinstance(body, Path):
                    with open(body, "rb") as f:
                        shutil.copyfileobj(f, self.wfile)
                else:
                    self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> FileServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
