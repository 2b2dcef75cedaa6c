"""`lpc bench predictor`: embedder alone, Predictor in process, and the RPC server under load."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lpc.cli import extras

if TYPE_CHECKING:  # torch-heavy: imported where a stage needs it, after the OpenMP setup
    import numpy as np

    from predictor.embedders.base import Embedder
    from predictor.predictor import Predictor
    from predictor.server_process import ServerProcess

SETS = ("paper", "worst", "stream")


def register(targets: argparse._SubParsersAction) -> None:
    parser = targets.add_parser(
        "predictor",
        help="predictions/s and latency: embedder, in-process Predictor, RPC under load",
        description=(
            "Measures three layers on the same windows: the embedder alone (batched texts/s, "
            "single-text latency), Predictor.predict in process (single-window latency, "
            "batched throughput), and a real `lpc serve` child process (sequential "
            "single-window latency, hence the RPC overhead; then --rpc-clients concurrent "
            "clients for --rpc-duration-s: predictions/s, latency percentiles, 503s) plus the "
            "server's peak RSS. Window sets: 'paper' (user-prompt windows sampled from the "
            "bundled ShareGPT file through the training loaders, or --windows-file) and "
            "'worst' (synthetic windows whose text fills the 512-token budget); 'stream' "
            "(every turn of the first --stream-conversations multi-turn ShareGPT "
            "conversations, in order, one call each: in-process only, the set that shows the "
            "prompt cache of --feature-mode prompt_mean). Without --artifact an untrained MLP "
            "is used: speed does not depend on its weights."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--sets", default="paper,worst", help="comma-separated window sets: paper, worst, stream"
    )
    parser.add_argument(
        "--windows-file",
        type=Path,
        default=None,
        help="JSONL windows for the 'paper' set instead of ShareGPT",
    )
    parser.add_argument("--paper-windows", type=int, default=96, help="windows in 'paper'")
    parser.add_argument("--worst-windows", type=int, default=32, help="windows in 'worst'")
    parser.add_argument(
        "--sharegpt-conversations",
        type=int,
        default=3000,
        help="ShareGPT conversations read to sample 'paper' windows from",
    )
    parser.add_argument(
        "--stream-conversations",
        type=int,
        default=30,
        help="multi-turn ShareGPT conversations in 'stream'",
    )
    parser.add_argument(
        "--feature-mode",
        choices=["joined", "prompt_mean"],
        default="joined",
        help="window encoding of the untrained artifact (ignored with "
        "--artifact, which carries its own)",
    )
    parser.add_argument("--embedder", default="e5-small-q4", help="embedder spec")
    parser.add_argument(
        "--artifact",
        "--model",
        dest="artifact",
        type=Path,
        default=None,
        help="trained artifact folder (--model is the same flag; default: an untrained MLP, "
        "speed only)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=8, help="texts per embedder call in the batched stages"
    )
    parser.add_argument(
        "--single-count", type=int, default=16, help="windows timed one call each (latency stages)"
    )
    parser.add_argument("--no-rpc", action="store_true", help="skip the server stages")
    parser.add_argument(
        "--rpc-clients",
        type=int,
        default=16,
        help="concurrent closed-loop clients in the load stage",
    )
    parser.add_argument(
        "--rpc-duration-s", type=float, default=20.0, help="length of the load stage per window set"
    )
    parser.add_argument("--server-max-batch", type=int, default=32, help="server --max-batch")
    parser.add_argument(
        "--server-max-wait-ms", type=float, default=0.0, help="server --max-wait-ms"
    )
    parser.add_argument("--server-max-queue", type=int, default=256, help="server --max-queue")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads, here and in the server (default: torch's)",
    )
    parser.add_argument("--seed", type=int, default=0, help="window sampling seed")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(run=run)


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

    from lpc.errors import CommandError
    from predictor.features import FeatureConfig, windows_for_conversation

    try:
        from training.loaders import BUNDLED_SHAREGPT, open_conversations
    except ImportError as error:
        raise CommandError(
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
    from lpc.errors import CommandError
    from predictor.features import windows_for_conversation

    try:
        from training.loaders import BUNDLED_SHAREGPT, open_conversations
    except ImportError as error:
        raise CommandError(
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


def untrained_artifact(folder: Path, embedder, spec: str, window_encoding: str = "joined") -> Path:
    import torch

    from predictor.artifact import ArtifactMetadata, save_artifact
    from predictor.features import FeatureConfig
    from predictor.model import ContinuationMLP, MLPConfig

    torch.manual_seed(0)
    config = MLPConfig(embedding_dim=embedder.dim)
    save_artifact(
        folder,
        ContinuationMLP(config),
        ArtifactMetadata(
            embedder_id=embedder.embedder_id,
            feature_config=FeatureConfig(window_encoding=window_encoding),
            mlp_config=config,
            base_rate=0.5,
            embedder_spec=spec,
            notes={"untrained": "benchmark only"},
        ),
    )
    return folder


def server_command(args: argparse.Namespace, artifact: Path, port: int) -> list[str]:
    from predictor.server_process import lpc_serve_command

    return lpc_serve_command(
        artifact,
        args.embedder,
        port,
        *("--max-batch", str(args.server_max_batch)),
        *("--max-wait-ms", str(args.server_max_wait_ms)),
        *("--max-queue", str(args.server_max_queue)),
        *("--embed-batch-size", str(args.batch_size)),
        *(["--threads", str(args.threads)] if args.threads else []),
    )


def run(args: argparse.Namespace) -> int:
    """Check the flags, build the window sets, load the subject, then measure: the embedder
    and the in-process Predictor on every set, then (unless --no-rpc) a real server. Each
    stage is a function below, in this order; each adds its figures to one result dict."""
    extras.require("serve")  # the text predictor and its RPC server
    from predictor.runtime import prefer_passive_openmp

    openmp = prefer_passive_openmp()  # before torch is imported: see predictor/runtime.py
    sets = checked_sets(args)
    window_sets = load_window_sets(args, sets)
    subject = load_subject(args)
    result = bench_header(args, subject, openmp)
    expected_by_set = bench_in_process_sets(args, subject, window_sets, result)
    if not args.no_rpc:
        bench_rpc(args, subject, window_sets, expected_by_set, result)
    subject.scratch.cleanup()

    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print_table(result)
    return 0


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


def checked_sets(args: argparse.Namespace) -> list[str]:
    """The chosen window sets; bad flags are refused before anything slow loads. --threads
    is applied here, before any stage builds a thread pool."""
    import torch

    from lpc.errors import CommandError

    if args.threads is not None:
        if args.threads < 1:
            raise CommandError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    unknown = sorted(set(sets) - set(SETS))
    if unknown or not sets:
        raise CommandError(f"--sets: unknown set(s) {unknown}; choose from {SETS}")
    for flag in (
        "paper_windows",
        "worst_windows",
        "batch_size",
        "single_count",
        "rpc_clients",
        "stream_conversations",
    ):
        if getattr(args, flag) <= 0:
            raise CommandError(
                f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}"
            )
    return sets


def load_window_sets(args: argparse.Namespace, sets: list[str]) -> WindowSets:
    """Each chosen set's windows with a line saying where they came from (printed with the
    figures, so a reader knows what was measured)."""
    from lpc.errors import CommandError
    from predictor import benchmark
    from predictor.windows_file import read_windows_jsonl

    window_sets: WindowSets = {}
    try:
        if "paper" in sets:
            if args.windows_file is not None:
                window_sets["paper"] = (
                    read_windows_jsonl(args.windows_file, args.paper_windows),
                    f"windows file {args.windows_file}",
                )
            else:
                window_sets["paper"] = sharegpt_windows(
                    args.paper_windows, args.sharegpt_conversations, args.seed
                )
        if "stream" in sets:
            window_sets["stream"] = sharegpt_stream(args.stream_conversations)
        if "worst" in sets:
            window_sets["worst"] = (
                benchmark.worst_case_windows(args.worst_windows, args.seed),
                "synthetic: 5 prompts of 600 words each (fills the budget)",
            )
    except OSError as error:  # a windows file or data file that cannot be read
        raise CommandError(str(error)) from error
    return window_sets


def load_subject(args: argparse.Namespace) -> Subject:
    """The embedder and a Predictor over --artifact, or over an untrained MLP written to the
    scratch folder (speed does not depend on the weights). Embedder and artifact problems are
    `UserError`s: one line from the CLI."""
    from predictor.embedders import load_embedder
    from predictor.predictor import Predictor

    embedder = load_embedder(args.embedder)
    scratch = tempfile.TemporaryDirectory(prefix="lpc-bench-predictor-")
    artifact = args.artifact or untrained_artifact(
        Path(scratch.name) / "untrained", embedder, args.embedder, args.feature_mode
    )
    predictor = Predictor.load(artifact, embedder=embedder, embed_batch_size=args.batch_size)
    return Subject(embedder, predictor, artifact, scratch)


def bench_header(args: argparse.Namespace, subject: Subject, openmp: Any) -> dict[str, Any]:
    """What the figures depend on besides the code: threads, CPUs, load, OpenMP, device."""
    import os

    import torch

    return {
        "embedder_id": subject.embedder.embedder_id,
        "artifact": str(args.artifact) if args.artifact else "untrained MLP (speed only)",
        "window_encoding": subject.predictor.feature_config.window_encoding,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "openmp": openmp,
        "device": getattr(subject.embedder, "device", "cpu"),
        "sets": {},
    }


def bench_in_process_sets(
    args: argparse.Namespace, subject: Subject, window_sets: WindowSets, result: dict[str, Any]
) -> dict[str, np.ndarray]:
    """The embedder and in-process stages of every set into `result["sets"]`. Returns each
    set's in-process answers: the server's answers under load are checked against them."""
    from predictor import benchmark

    expected_by_set = {}
    for name, (windows, source) in window_sets.items():
        if name == "stream":
            progress(args, f"stream: {len(windows)} windows in order, one call each")
            result["sets"][name] = {
                "source": source,
                "windows": len(windows),
                "stream": benchmark.bench_stream(subject.predictor, windows),
            }
            continue
        progress(args, f"{name}: {len(windows)} windows; embedder and in-process stages")
        texts = subject.predictor.window_texts(windows)
        entry: dict[str, Any] = {
            "source": source,
            "windows": len(windows),
            "input_tokens": benchmark.token_counts(subject.predictor, texts),
        }
        entry["embedder"] = benchmark.bench_embedder(
            subject.embedder, texts, args.batch_size, args.single_count
        )
        entry["in_process"], expected_by_set[name] = benchmark.bench_in_process(
            subject.predictor, windows, args.batch_size, args.single_count
        )
        result["sets"][name] = entry
    return expected_by_set


def bench_rpc(
    args: argparse.Namespace,
    subject: Subject,
    window_sets: WindowSets,
    expected_by_set: dict[str, np.ndarray],
    result: dict[str, Any],
) -> None:
    """Start `lpc serve` on the same artifact, measure every set against it, then the RPC's
    own cost on tiny windows and the server's peak memory. A server that fails to start or
    dies is a one-line error followed by the end of its log."""
    import os

    from lpc.errors import CommandError
    from predictor.server_process import ServerProcess, free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    repo_root = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [repo_root, os.environ.get("PYTHONPATH")]))}
    progress(args, "starting lpc serve")
    log_path = Path(subject.scratch.name) / "server.log"
    try:
        with ServerProcess(
            server_command(args, subject.artifact, port), url, log_path=log_path, env=env
        ) as process:
            server = LiveServer(process, url)
            bench_rpc_sets(args, subject, server, window_sets, expected_by_set, result)
            bench_rpc_tail(args, subject, server, result)
    except (RuntimeError, TimeoutError) as error:
        log = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
        raise CommandError(f"{error}\n{log}") from error


def bench_rpc_sets(
    args: argparse.Namespace,
    subject: Subject,
    server: LiveServer,
    window_sets: WindowSets,
    expected_by_set: dict[str, np.ndarray],
    result: dict[str, Any],
) -> None:
    """Per set (the stream set has no server stage): paired in-process / RPC latency of
    single windows, hence the RPC overhead, then the load stage."""
    from predictor import benchmark

    for name, (windows, _) in window_sets.items():
        if name == "stream":
            continue
        entry = result["sets"][name]
        progress(args, f"{name}: paired in-process / RPC latency")
        paired = benchmark.bench_rpc_overhead(
            subject.predictor, server.url, windows[: args.single_count]
        )
        entry["rpc_single"] = paired
        entry["rpc_overhead_ms_p50"] = paired["overhead_ms_p50"]
        entry["rpc_load"] = rpc_load(args, server, name, windows, expected_by_set[name])


def rpc_load(
    args: argparse.Namespace,
    server: LiveServer,
    name: str,
    windows: list,
    expected: np.ndarray,
) -> dict[str, Any]:
    """--rpc-clients closed-loop clients for --rpc-duration-s, every answer checked against
    the in-process one; with the server's CPU time per prediction where /proc tells it."""
    from predictor import benchmark
    from predictor.load_test import LoadTestConfig, run_load_test

    progress(args, f"{name}: {args.rpc_clients} clients for {args.rpc_duration_s} s")
    cpu_before = benchmark.process_cpu_seconds(server.process.pid)
    report = run_load_test(
        LoadTestConfig(
            server.url, clients=args.rpc_clients, duration_s=args.rpc_duration_s, tolerance=1e-5
        ),
        windows,
        expected,
    )
    cpu_after = benchmark.process_cpu_seconds(server.process.pid)
    load = report.as_dict()
    if cpu_before is not None and cpu_after is not None:
        load["server_cpu_ms_per_prediction"] = round(
            (cpu_after - cpu_before) * 1000 / max(report.windows_answered, 1), 2
        )
    return load


def bench_rpc_tail(
    args: argparse.Namespace, subject: Subject, server: LiveServer, result: dict[str, Any]
) -> None:
    """The RPC's own cost where the model's is small (tiny windows), then the server's peak
    memory, the load at the end, and how the server stopped."""
    import os

    from predictor import benchmark

    progress(args, "RPC overhead on tiny windows (paired)")
    result["rpc_overhead_tiny"] = benchmark.bench_rpc_overhead(
        subject.predictor, server.url, benchmark.tiny_windows(64)
    )
    result["server_peak_rss_mb"] = round(server.process.peak_rss_mb() or float("nan"), 1)
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["server_exit_code"] = server.process.stop()


def progress(args: argparse.Namespace, message: str) -> None:
    print(f"[bench predictor] {message}", file=sys.stderr, flush=True)


def print_table(result: dict[str, Any]) -> None:
    """The figures as text: the conditions, then one block per window set, then the RPC
    overhead on tiny windows and the server's peak memory when the server stages ran."""
    print_conditions(result)
    for name, entry in result["sets"].items():
        if name == "stream":
            print_stream_set(result, entry)
        else:
            print_window_set(name, entry)
    if "rpc_overhead_tiny" in result:
        tiny = result["rpc_overhead_tiny"]
        print(
            f"\nRPC overhead on one-short-prompt windows (64 paired calls): median "
            f"{tiny['overhead_ms_p50']:.2f} ms, inside the server "
            f"{tiny['server_overhead_ms_mean']:.2f} ms (in process p50 "
            f"{tiny['in_process_latency']['p50_ms']:.1f} ms, RPC p50 "
            f"{tiny['rpc_latency']['p50_ms']:.1f} ms)"
        )
    if "server_peak_rss_mb" in result:
        print(f"server peak RSS: {result['server_peak_rss_mb']} MB")


def print_conditions(result: dict[str, Any]) -> None:
    """What the figures were measured on: embedder, device, threads, artifact, load."""
    print(
        f"embedder {result['embedder_id']} on {result['device']}, "
        f"{result['torch_threads']} torch threads; artifact: {result['artifact']}, "
        f"window encoding {result['window_encoding']}"
    )
    print(
        f"load average (1, 5, 15 min) at start: {result['load_average_at_start']} "
        f"on {result['cpu_count']} CPUs"
    )


def print_stream_set(result: dict[str, Any], entry: dict[str, Any]) -> None:
    """The stream set: one line, with the prompt cache's figures (prompt_mean fills it)."""
    stream = entry["stream"]
    lat = stream["latency"]
    print(f"\n[stream] {entry['source']}")
    print(
        f"  {result['window_encoding']}: {stream['items_per_s']:.2f} predictions/s, "
        f"p50 {lat['p50_ms']:.1f} ms, p95 {lat['p95_ms']:.1f} ms, "
        f"p99 {lat['p99_ms']:.1f} ms; prompt cache: {stream.get('prompt_cache')}"
    )


def print_window_set(name: str, entry: dict[str, Any]) -> None:
    """One set's table: a row per stage, then the load stage and the RPC overhead."""
    tokens = entry["input_tokens"]
    print(f"\n[{name}] {entry['source']}")
    print(
        f"  input tokens per window: mean {tokens['mean']}, p50 {tokens['p50']}, "
        f"max {tokens['max']}"
    )
    print(
        f"  {'stage':<28}{'items/s':>9}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}"
        f"{'CPU ms/item':>13}"
    )
    for label, stage in stage_rows(entry):
        lat = stage["latency"]
        cpu = stage.get("cpu_ms_per_item", float("nan"))
        print(
            f"  {label:<28}{stage['items_per_s']:>9.2f}{lat['p50_ms']:>10.1f}"
            f"{lat['p95_ms']:>10.1f}{lat['p99_ms']:>10.1f}{cpu:>13.1f}"
        )
    if "rpc_load" in entry:
        print_rpc_load(entry)


def stage_rows(entry: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, stage) rows of a set's table; the paired single-window latencies, when the
    server stages ran, are rows too (no throughput: they are timed one call at a time)."""
    rows = [
        ("embedder, batched", entry["embedder"]["batched"]),
        ("embedder, 1 text/call", entry["embedder"]["single"]),
        ("in-process, batched", entry["in_process"]["batched"]),
        ("in-process, 1 window/call", entry["in_process"]["single"]),
    ]
    if "rpc_single" in entry:
        paired = entry["rpc_single"]
        rows.append(
            (
                "paired: in-process, 1/call",
                {"items_per_s": float("nan"), "latency": paired["in_process_latency"]},
            )
        )
        rows.append(
            (
                "paired: RPC, 1/request",
                {"items_per_s": float("nan"), "latency": paired["rpc_latency"]},
            )
        )
    return rows


def print_rpc_load(entry: dict[str, Any]) -> None:
    """The load stage as a row of the table, then the overhead and every request's outcome."""
    load = entry["rpc_load"]
    lat = load["ok_latency"]
    print(
        f"  {'RPC, ' + str(load['clients']) + ' clients':<28}"
        f"{load['predictions_per_s']:>9.2f}{lat['p50_ms']:>10.1f}"
        f"{lat['p95_ms']:>10.1f}{lat['p99_ms']:>10.1f}"
        f"{load.get('server_cpu_ms_per_prediction', float('nan')):>13.1f}"
    )
    print(
        f"  RPC overhead: median of paired differences "
        f"{entry['rpc_overhead_ms_p50']:.2f} ms, inside the server "
        f"{entry['rpc_single']['server_overhead_ms_mean']:.2f} ms; load: "
        f"{load['answered_ok']} ok, {load['overloaded_503']} 503, "
        f"{load['lost']} lost, {load['mismatched']} mismatched"
    )
