"""A prediction server in a child process: start, wait until healthy, measure, stop.

Used by the benchmark and the load-test script, which must measure the real server (its own
process, its own peak RSS) rather than an app object in the measuring process. The command is
the caller's (normally `lpc serve ...`), so this module depends on nothing outside predictor.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def lpc_serve_command(artifact: Path, embedder: str, port: int, *options: str) -> list[str]:
    """`python -m lpc.cli serve` for `artifact` on `port`, warnings-only log, plus `options`
    (batching, queue, timeouts): the one command line the benchmark and the load test run."""
    return [
        sys.executable,
        *("-m", "lpc.cli", "serve", "--artifact", str(artifact), "--embedder", embedder),
        *("--port", str(port), "--log-level", "warning", *options),
    ]


def peak_rss_mb(pid: int) -> float | None:
    """Peak resident set size (VmHWM) of a live process, from /proc (Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class ServerProcess:
    """`with ServerProcess(cmd, url) as server:` — healthy on entry, SIGTERM-stopped on exit."""

    def __init__(
        self,
        command: Sequence[str],
        url: str,
        startup_timeout_s: float = 300.0,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.command = list(command)
        self.url = url.rstrip("/")
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self._log = None

    def __enter__(self) -> ServerProcess:
        self._log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            self.command, stdout=self._log, stderr=self._log, env=self.env
        )
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.process.returncode} during "
                    f"startup (log: {self.log_path})"
                )
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"server not healthy after {self.startup_timeout_s} s")
            time.sleep(0.25)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def peak_rss_mb(self) -> float | None:
        return peak_rss_mb(self.pid)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.exit_code = self.process.wait()
        return self.exit_code

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
