"""A stand-in prediction RPC on 127.0.0.1 that answers, hangs, or is not there at all.

It speaks the predictor server's wire format (POST /v1/predict with {"items": [...]},
answer {"probabilities": [...]}) so that the real `predictor.client.PredictorClient` inside
the plugin talks to it over real HTTP. Never bound beyond the loopback.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def fake_predictor(
    mode: str, answer: Callable[[dict[str, Any]], float] | None = None
) -> Iterator[tuple[str, dict[str, int]]]:
    """Yield (base URL, counters). Modes: "up" (answers `answer(item)` for each item),
    "hang" (never answers until the context exits), "down" (nothing listens on the port)."""
    counters = {"requests": 0, "items": 0}
    if mode == "down":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        yield f"http://127.0.0.1:{port}", counters  # the port is closed again: refused
        return
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            items = body["items"]
            counters["requests"] += 1
            counters["items"] += len(items)
            if mode == "hang":
                release.wait(120)
                status, payload = 503, {"detail": "overloaded"}
            else:
                assert answer is not None
                status, payload = 200, {"probabilities": [answer(item) for item in items]}
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client gave up (timeout) and closed the connection

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", counters
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)
