"""The load test of a real `lpc serve`: start it as a child process, compute every window's
expected answer in this process with the same artifact and embedder, drive it with closed-loop
clients (`lpc.benchmarks.load_test`), and judge the outcome. `scripts/predictor_load_test.py`
is its command line; its --help says what each option does.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lpc.benchmarks.load_test import LoadTestConfig, LoadTestReport, run_load_test

if TYPE_CHECKING:  # torch-heavy: imported where needed, after the caller's OpenMP setup
    from predictor.features import ConversationWindow
    from predictor.predictor import Predictor
    from predictor.server_process import ServerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
OVERLOADED_SERIES = 'lpc_predictor_errors_total{kind="overloaded"}'


@dataclass(frozen=True)
class ServeLoadTestOptions:
    """The server's limits, the windows and the load (the script's flags, one to one)."""

    clients: int = 64
    duration_s: float = 30.0
    max_requests: int | None = None
    embedder: str = "e5-small-q4"
    artifact: Path | None = None
    windows: int = 256
    windows_file: Path | None = None
    source: str = "sharegpt"
    items_per_request: int = 1
    max_items_per_request: int | None = None
    warmup_s: float = 0.0
    max_batch: int = 32
    max_wait_ms: float = 0.0
    max_queue: int = 32
    request_timeout_s: float = 30.0
    tolerance: float = 1e-5


@dataclass
class ServerRun:
    """What the server stages leave: the reports, the server's own counts and how it ended."""

    command: list[str]
    warmup: LoadTestReport | None
    report: LoadTestReport
    metrics: str
    peak_rss_mb: float | None
    stop_seconds: float
    exit_code: int | None
    log_tail: str


def short_windows(count: int) -> list[ConversationWindow]:
    """First turns of at most 8 words: what a server that just started mostly sees."""
    from lpc.benchmarks.predictor_layers import synthetic_windows
    from predictor.features import ConversationWindow

    return [
        ConversationWindow(f"warmup-{i}", (" ".join(w.user_prompts[-1].split()[:8]),), 1)
        for i, w in enumerate(synthetic_windows(count, seed=1))
    ]


def metric_value(text: str, series: str) -> float:
    """One series' value in a Prometheus text page; 0 when the page lacks it."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def load_windows(options: ServeLoadTestOptions) -> list[ConversationWindow]:
    """The windows the clients cycle through: a JSONL file, or the chosen source."""
    from lpc.benchmarks.predictor_bench import sharegpt_windows
    from lpc.benchmarks.predictor_layers import synthetic_windows, worst_case_windows
    from predictor.windows_file import read_windows_jsonl

    if options.windows_file:
        return read_windows_jsonl(options.windows_file, options.windows)
    if options.source == "worst":
        return worst_case_windows(options.windows)
    if options.source == "synthetic":
        return synthetic_windows(options.windows)
    windows, _ = sharegpt_windows(options.windows, 3000, seed=0)
    return windows


def run_serve_load_test(options: ServeLoadTestOptions) -> dict[str, Any]:
    """The whole test; its result's `passed` is the verdict: both load stages passed and the
    server counted exactly the 503s the clients saw."""
    from lpc.benchmarks.predictor_layers import untrained_artifact
    from predictor.embedders import load_embedder
    from predictor.predictor import Predictor

    windows = load_windows(options)
    embedder = load_embedder(options.embedder)
    with tempfile.TemporaryDirectory(prefix="lpc-load-test-") as scratch:
        artifact = options.artifact or untrained_artifact(
            Path(scratch) / "untrained", embedder, options.embedder
        )
        _progress(f"expected answers for {len(windows)} windows (in process)")
        reference = Predictor.load(artifact, embedder=embedder)
        run = drive_server(options, artifact, reference, windows, Path(scratch) / "server.log")
    return result_of(options, run, embedder.embedder_id, len(windows))


def server_command(options: ServeLoadTestOptions, artifact: Path, port: int) -> list[str]:
    from predictor.server_process import lpc_serve_command

    return lpc_serve_command(
        artifact,
        options.embedder,
        port,
        *("--max-batch", str(options.max_batch)),
        *("--max-wait-ms", str(options.max_wait_ms)),
        *("--max-queue", str(options.max_queue)),
        *("--request-timeout-s", str(options.request_timeout_s)),
    )


def drive_server(
    options: ServeLoadTestOptions,
    artifact: Path,
    reference: Predictor,
    windows: list[ConversationWindow],
    log: Path,
) -> ServerRun:
    """Start `lpc serve`, run the warm-up (if any) and the load, read its metrics, stop it."""
    from predictor.server_process import ServerProcess, free_port

    expected = reference.predict(windows)
    warmup_windows = short_windows(64) if options.warmup_s > 0 else []
    warmup_expected = reference.predict(warmup_windows) if warmup_windows else None
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = server_command(options, artifact, port)
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    }
    _progress(f"starting {' '.join(command[1:])}")
    with ServerProcess(command, url, log_path=log, env=env) as server:
        warmup = None
        if warmup_windows:
            _progress(f"warm-up: short windows for {options.warmup_s} s")
            warmup = run_load_test(
                LoadTestConfig(
                    url, clients=4, duration_s=options.warmup_s, tolerance=options.tolerance
                ),
                warmup_windows,
                warmup_expected,
            )
        _progress(f"{options.clients} clients for {options.duration_s} s")
        report = run_load_test(load_config(options, url), windows, expected)
        return stop_server(server, url, command, warmup, report, log)


def load_config(options: ServeLoadTestOptions, url: str) -> LoadTestConfig:
    return LoadTestConfig(
        url,
        clients=options.clients,
        duration_s=options.duration_s,
        max_requests=options.max_requests,
        items_per_request=options.items_per_request,
        max_items_per_request=options.max_items_per_request,
        tolerance=options.tolerance,
    )


def stop_server(
    server: ServerProcess,
    url: str,
    command: list[str],
    warmup: LoadTestReport | None,
    report: LoadTestReport,
    log: Path,
) -> ServerRun:
    """The server's metrics and peak memory after the load, then how long it took to stop."""
    import httpx

    metrics = httpx.get(url + "/metrics", timeout=10).text
    rss = server.peak_rss_mb()
    started = time.monotonic()
    exit_code = server.stop()
    stop_s = time.monotonic() - started
    return ServerRun(
        command,
        warmup,
        report,
        metrics,
        rss,
        round(stop_s, 2),
        exit_code,
        log.read_text(errors="replace")[-1500:],
    )


def result_of(
    options: ServeLoadTestOptions, run: ServerRun, embedder_id: str, window_count: int
) -> dict[str, Any]:
    """The verdict, the server's side, what was measured on, and both load reports."""
    overloaded_metric = metric_value(run.metrics, OVERLOADED_SERIES)
    warmup_overloaded = run.warmup.overloaded_503 if run.warmup else 0
    warmup_passed = run.warmup is None or run.warmup.passed
    return {
        "passed": warmup_passed
        and run.report.passed
        and overloaded_metric == run.report.overloaded_503 + warmup_overloaded,
        "server": {
            "command": " ".join(run.command[1:]),
            "peak_rss_mb": run.peak_rss_mb,
            "overloaded_counted_by_server": overloaded_metric,
            "stop_seconds": run.stop_seconds,
            "exit_code": run.exit_code,
            "log_tail": run.log_tail,
        },
        "embedder_id": embedder_id,
        "windows": window_count,
        "source": str(options.windows_file or options.source),
        "load_average_1m": os.getloadavg()[0],
        "warmup": run.warmup.as_dict() if run.warmup else None,
        "report": run.report.as_dict(),
    }


def _progress(message: str) -> None:
    print(message, file=sys.stderr)
