"""`lpc bench predictor`'s measurement: the window sets, the subject (embedder, Predictor,
artifact), then each stage in order: embedder and Predictor in process, a real `lpc serve`
under load. The figures go into one result dict; `lpc.benchmarks.predictor_layers` measures
each layer.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch-heavy: imported where a stage needs it, after the OpenMP setup
    import numpy as np

    from predictor.embedders.base import Embedder
    from predictor.predictor import Predictor
    from predictor.server_process import ServerProcess

SETS = ("paper", "worst", "stream")


@dataclass(frozen=True)
class PredictorBenchOptions:
    """What to measure and how hard (`lpc bench predictor --help` says what each does)."""

    sets: tuple[str, ...] = ("paper", "worst")
    windows_file: Path | None = None
    paper_windows: int = 96
    worst_windows: int = 32
    sharegpt_conversations: int = 3000
    stream_conversations: int = 30
    feature_mode: str = "joined"
    embedder: str = "e5-small-q4"
    artifact: Path | None = None
    batch_size: int = 8
    single_count: int = 16
    rpc: bool = True
    rpc_clients: int = 16
    rpc_duration_s: float = 20.0
    server_max_batch: int = 32
    server_max_wait_ms: float = 0.0
    server_max_queue: int = 256
    threads: int | None = None
    seed: int = 0


def run_predictor_bench(options: PredictorBenchOptions, openmp: Any) -> dict[str, Any]:
    """Build the window sets, load the subject, then measure: the embedder and the in-process
    Predictor on every set, then (unless `rpc` is off) a real server. Each stage is a function
    below, in this order; each adds its figures to one result dict."""
    window_sets = load_window_sets(options, list(options.sets))
    subject = load_subject(options)
    try:
        result = bench_header(options, subject, openmp)
        expected_by_set = bench_in_process_sets(options, subject, window_sets, result)
        if options.rpc:
            bench_rpc(options, subject, window_sets, expected_by_set, result)
    finally:
        subject.scratch.cleanup()
    return result


class _PromptCounter:
    """Each turn's serving prompt size (Qwen ChatML, as `lpc train` counts it on ShareGPT): a
    model with the `log_prompt_tokens` feature needs it on its windows, others ignore it."""

    def __init__(self) -> None:
        from lpc.chat.tokenization import DEFAULT_MAX_MODEL_LEN, ChatTemplate
        from lpc.chat.tokenizers import default_chat_tokenizer

        self._template = ChatTemplate(default_chat_tokenizer())  # built once: it is slow
        self._max_model_len = DEFAULT_MAX_MODEL_LEN

    def attach(self, conversation, windows: list) -> list:
        """The windows with their turn's count; turns beyond the max_model_len cut keep none."""
        from dataclasses import replace

        from lpc.chat.tokenization import conversation_tokens

        turns = conversation_tokens(conversation, self._template, self._max_model_len).turns
        counts = [turn.num_prompt_tokens for turn in turns]
        return [
            replace(w, prompt_tokens=counts[w.turn_count - 1])
            if w.turn_count - 1 < len(counts)
            else w
            for w in windows
        ]


def sharegpt_windows(count: int, conversations: int, seed: int) -> tuple[list, str]:
    """Windows sampled from the bundled ShareGPT file, read only through training.loaders."""
    import numpy as np

    from lpc.errors import UserError
    from predictor.features import FeatureConfig, windows_for_conversation

    try:
        from training.loaders import BUNDLED_SHAREGPT, open_conversations
    except ImportError as error:
        raise UserError(
            "the ShareGPT loader (training.loaders) is not in this checkout; "
            "pass --windows-file FILE.jsonl for the 'paper' set"
        ) from error
    keep = FeatureConfig().window_size
    counter = _PromptCounter()
    windows = []
    with open_conversations(BUNDLED_SHAREGPT, limit=conversations) as stream:
        for conversation in stream:
            prompts = conversation.user_prompts()
            if prompts:
                windows.extend(
                    counter.attach(
                        conversation,
                        windows_for_conversation(
                            conversation.conversation_id, prompts, keep_last=keep
                        ),
                    )
                )
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(windows), size=min(count, len(windows)), replace=False)
    source = (
        f"ShareGPT (bundled), {len(windows)} user-turn windows of the first "
        f"{conversations} conversations, {len(chosen)} sampled (seed {seed})"
    )
    return [windows[i] for i in sorted(chosen)], source


def sharegpt_stream(conversations: int) -> tuple[list, str]:
    """Every turn of the first multi-turn ShareGPT conversations, in conversation order."""
    from lpc.errors import UserError
    from predictor.features import windows_for_conversation

    try:
        from training.loaders import BUNDLED_SHAREGPT, open_conversations
    except ImportError as error:
        raise UserError(
            "the ShareGPT loader (training.loaders) is not in this checkout; "
            "the 'stream' set needs it"
        ) from error
    counter = _PromptCounter()
    windows, taken = [], 0
    with open_conversations(BUNDLED_SHAREGPT) as stream:
        for conversation in stream:
            prompts = conversation.user_prompts()
            if len(prompts) < 2:
                continue
            windows.extend(
                counter.attach(
                    conversation, windows_for_conversation(conversation.conversation_id, prompts)
                )
            )
            taken += 1
            if taken == conversations:
                break
    return windows, (
        f"ShareGPT (bundled), all {len(windows)} turns of the first {taken} "
        f"conversations with 2+ user turns, in order"
    )


def server_command(options: PredictorBenchOptions, artifact: Path, port: int) -> list[str]:
    from predictor.server_process import lpc_serve_command

    return lpc_serve_command(
        artifact,
        options.embedder,
        port,
        *("--max-batch", str(options.server_max_batch)),
        *("--max-wait-ms", str(options.server_max_wait_ms)),
        *("--max-queue", str(options.server_max_queue)),
        *("--embed-batch-size", str(options.batch_size)),
        *(["--threads", str(options.threads)] if options.threads else []),
    )


WindowSets = dict[str, tuple[list, str]]  # set name -> (windows, where they came from)


@dataclass(frozen=True)
class Subject:
    """What is measured: the embedder, the Predictor over it, the artifact folder a server
    loads, and a scratch folder (the untrained artifact, the server's log)."""

    embedder: Embedder
    predictor: Predictor
    artifact: Path
    scratch: tempfile.TemporaryDirectory[str]


@dataclass(frozen=True)
class LiveServer:
    """A running `lpc serve` child and its address."""

    process: ServerProcess
    url: str


def load_window_sets(options: PredictorBenchOptions, sets: list[str]) -> WindowSets:
    """Each chosen set's windows with a line saying where they came from (printed with the
    figures, so a reader knows what was measured)."""
    from lpc.benchmarks import predictor_layers
    from lpc.errors import UserError
    from predictor.windows_file import read_windows_jsonl

    window_sets: WindowSets = {}
    try:
        if "paper" in sets:
            if options.windows_file is not None:
                window_sets["paper"] = (
                    read_windows_jsonl(options.windows_file, options.paper_windows),
                    f"windows file {options.windows_file}",
                )
            else:
                window_sets["paper"] = sharegpt_windows(
                    options.paper_windows, options.sharegpt_conversations, options.seed
                )
        if "stream" in sets:
            window_sets["stream"] = sharegpt_stream(options.stream_conversations)
        if "worst" in sets:
            window_sets["worst"] = (
                predictor_layers.worst_case_windows(options.worst_windows, options.seed),
                "synthetic: 5 prompts of 600 words each (fills the budget)",
            )
    except OSError as error:  # a windows file or data file that cannot be read
        raise UserError(str(error)) from error
    return window_sets


def load_subject(options: PredictorBenchOptions) -> Subject:
    """The embedder and a Predictor over --artifact, or over an untrained MLP written to the
    scratch folder (speed does not depend on the weights). Embedder and artifact problems are
    `UserError`s: one line from the CLI."""
    from lpc.benchmarks import predictor_layers
    from predictor.embedders import load_embedder
    from predictor.predictor import Predictor

    embedder = load_embedder(options.embedder)
    scratch = tempfile.TemporaryDirectory(prefix="lpc-bench-predictor-")
    artifact = options.artifact or predictor_layers.untrained_artifact(
        Path(scratch.name) / "untrained", embedder, options.embedder, options.feature_mode
    )
    predictor = Predictor.load(artifact, embedder=embedder, embed_batch_size=options.batch_size)
    return Subject(embedder, predictor, artifact, scratch)


def bench_header(options: PredictorBenchOptions, subject: Subject, openmp: Any) -> dict[str, Any]:
    """What the figures depend on besides the code: threads, CPUs, load, OpenMP, device."""
    import os

    import torch

    return {
        "embedder_id": subject.embedder.embedder_id,
        "artifact": str(options.artifact) if options.artifact else "untrained MLP (speed only)",
        "window_encoding": subject.predictor.feature_config.window_encoding,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "openmp": openmp,
        "device": getattr(subject.embedder, "device", "cpu"),
        "sets": {},
    }


def bench_in_process_sets(
    options: PredictorBenchOptions,
    subject: Subject,
    window_sets: WindowSets,
    result: dict[str, Any],
) -> dict[str, np.ndarray]:
    """The embedder and in-process stages of every set into `result["sets"]`. Returns each
    set's in-process answers: the server's answers under load are checked against them."""
    from lpc.benchmarks import predictor_layers

    expected_by_set = {}
    for name, (windows, source) in window_sets.items():
        if name == "stream":
            _progress(f"stream: {len(windows)} windows in order, one call each")
            result["sets"][name] = {
                "source": source,
                "windows": len(windows),
                "stream": predictor_layers.bench_stream(subject.predictor, windows),
            }
            continue
        _progress(f"{name}: {len(windows)} windows; embedder and in-process stages")
        texts = subject.predictor.window_texts(windows)
        entry: dict[str, Any] = {
            "source": source,
            "windows": len(windows),
            "input_tokens": predictor_layers.token_counts(subject.predictor, texts),
        }
        entry["embedder"] = predictor_layers.bench_embedder(
            subject.embedder, texts, options.batch_size, options.single_count
        )
        entry["in_process"], expected_by_set[name] = predictor_layers.bench_in_process(
            subject.predictor, windows, options.batch_size, options.single_count
        )
        result["sets"][name] = entry
    return expected_by_set


def bench_rpc(
    options: PredictorBenchOptions,
    subject: Subject,
    window_sets: WindowSets,
    expected_by_set: dict[str, np.ndarray],
    result: dict[str, Any],
) -> None:
    """Start `lpc serve` on the same artifact, measure every set against it, then the RPC's
    own cost on tiny windows and the server's peak memory. A server that fails to start or
    dies is a one-line error followed by the end of its log."""
    import os

    from lpc.errors import UserError
    from predictor.server_process import ServerProcess, free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    repo_root = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [repo_root, os.environ.get("PYTHONPATH")]))}
    _progress("starting lpc serve")
    log_path = Path(subject.scratch.name) / "server.log"
    try:
        with ServerProcess(
            server_command(options, subject.artifact, port), url, log_path=log_path, env=env
        ) as process:
            server = LiveServer(process, url)
            bench_rpc_sets(options, subject, server, window_sets, expected_by_set, result)
            bench_rpc_tail(options, subject, server, result)
    except (RuntimeError, TimeoutError) as error:
        log = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
        raise UserError(f"{error}\n{log}") from error


def bench_rpc_sets(
    options: PredictorBenchOptions,
    subject: Subject,
    server: LiveServer,
    window_sets: WindowSets,
    expected_by_set: dict[str, np.ndarray],
    result: dict[str, Any],
) -> None:
    """Per set (the stream set has no server stage): paired in-process / RPC latency of
    single windows, hence the RPC overhead, then the load stage."""
    from lpc.benchmarks import predictor_layers

    for name, (windows, _) in window_sets.items():
        if name == "stream":
            continue
        entry = result["sets"][name]
        _progress(f"{name}: paired in-process / RPC latency")
        paired = predictor_layers.bench_rpc_overhead(
            subject.predictor, server.url, windows[: options.single_count]
        )
        entry["rpc_single"] = paired
        entry["rpc_overhead_ms_p50"] = paired["overhead_ms_p50"]
        entry["rpc_load"] = rpc_load(options, server, name, windows, expected_by_set[name])


def rpc_load(
    options: PredictorBenchOptions,
    server: LiveServer,
    name: str,
    windows: list,
    expected: np.ndarray,
) -> dict[str, Any]:
    """--rpc-clients closed-loop clients for --rpc-duration-s, every answer checked against
    the in-process one; with the server's CPU time per prediction where /proc tells it."""
    from lpc.benchmarks import predictor_layers
    from lpc.benchmarks.load_test import LoadTestConfig, run_load_test

    _progress(f"{name}: {options.rpc_clients} clients for {options.rpc_duration_s} s")
    cpu_before = predictor_layers.process_cpu_seconds(server.process.pid)
    report = run_load_test(
        LoadTestConfig(
            server.url,
            clients=options.rpc_clients,
            duration_s=options.rpc_duration_s,
            tolerance=1e-5,
        ),
        windows,
        expected,
    )
    cpu_after = predictor_layers.process_cpu_seconds(server.process.pid)
    load = report.as_dict()
    if cpu_before is not None and cpu_after is not None:
        load["server_cpu_ms_per_prediction"] = round(
            (cpu_after - cpu_before) * 1000 / max(report.windows_answered, 1), 2
        )
    return load


def bench_rpc_tail(
    options: PredictorBenchOptions, subject: Subject, server: LiveServer, result: dict[str, Any]
) -> None:
    """The RPC's own cost where the model's is small (tiny windows), then the server's peak
    memory, the load at the end, and how the server stopped."""
    import os

    from lpc.benchmarks import predictor_layers

    _progress("RPC overhead on tiny windows (paired)")
    result["rpc_overhead_tiny"] = predictor_layers.bench_rpc_overhead(
        subject.predictor, server.url, predictor_layers.tiny_windows(64)
    )
    result["server_peak_rss_mb"] = round(server.process.peak_rss_mb() or float("nan"), 1)
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["server_exit_code"] = server.process.stop()


def _progress(message: str) -> None:
    print(f"[bench predictor] {message}", file=sys.stderr, flush=True)
