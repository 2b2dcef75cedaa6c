"""Run the real uvicorn server on a free loopback port in a background thread, and talk to it.

The servers are plain HTTP on loopback, so the clients here build no TLS context: httpx
builds one for every client (and every `httpx.get`/`httpx.post`) by default, loading the CA
bundle, about 50 ms of processor each; the suite's server tests make a few hundred.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn.server

from predictor.client import PredictorClient
from predictor.server import ServerConfig, uvicorn_server

LOOPBACK_THREAD = "loopback-uvicorn"


class _ShortPolls:
    """`asyncio` as uvicorn's server module sees it, with its waits capped at 10 ms in the
    threads `running_server` starts (other threads see plain asyncio). uvicorn polls
    `should_exit` every 100 ms, pauses a fixed 100 ms once it has asked the connections to
    close, then polls every 100 ms for them to be gone: ~150 ms idle per server a test
    stops, most of a small server test. The steps and their order are uvicorn's own."""

    def __getattr__(self, name: str):
        return getattr(asyncio, name)

    @staticmethod
    async def sleep(delay: float, result=None):
        if threading.current_thread().name == LOOPBACK_THREAD:
            delay = min(delay, 0.01)
        return await asyncio.sleep(delay, result)


uvicorn.server.asyncio = _ShortPolls()


@contextmanager
def running_server(app, config: ServerConfig) -> Iterator[tuple[str, object]]:
    """Yield (base_url, uvicorn.Server); on exit, shut down gracefully and join.

    The listening socket names its protocol (IPPROTO_TCP): asyncio switches Nagle's algorithm
    off (TCP_NODELAY) only on connections whose socket says TCP, and with it on, every answer
    after a connection's first waited ~40 ms for the client's delayed acknowledgement."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn_server(app, config, log_level="warning")
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=LOOPBACK_THREAD
    )
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
