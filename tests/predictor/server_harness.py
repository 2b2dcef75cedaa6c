"""Run the real uvicorn server on a free loopback port in a background thread, and talk to it.

The servers are plain HTTP on loopback, so the clients here build no TLS context: httpx
builds one for every client (and every `httpx.get`/`httpx.post`) by default, loading the CA
bundle, about 50 ms of processor each; the suite's server tests make a few hundred.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from predictor.client import PredictorClient
from predictor.server import ServerConfig, uvicorn_server


@contextmanager
def running_server(app, config: ServerConfig) -> Iterator[tuple[str, object]]:
    """Yield (base_url, uvicorn.Server); on exit, shut down gracefully and join."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn_server(app, config, log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()


def get(url: str, **kwargs) -> httpx.Response:
    """`httpx.get` to a plain-HTTP server: no TLS context built."""
    return httpx.get(url, verify=False, **kwargs)


def post(url: str, **kwargs) -> httpx.Response:
    """`httpx.post` to a plain-HTTP server: no TLS context built."""
    return httpx.post(url, verify=False, **kwargs)


def http_client(**kwargs) -> httpx.Client:
    """`httpx.Client` for plain-HTTP servers: no TLS context built."""
    return httpx.Client(verify=False, **kwargs)


def predictor_client(url: str, **kwargs) -> PredictorClient:
    """The real `PredictorClient` over httpx's own transport, built without a TLS context."""
    return PredictorClient(url, transport=httpx.HTTPTransport(verify=False), **kwargs)
