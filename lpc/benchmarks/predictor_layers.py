"""Measurements behind `lpc bench predictor`: embedder alone, Predictor in process, RPC.

Each function measures one layer on the same windows so the layers can be subtracted: the RPC
overhead is (sequential single-window RPC latency) − (in-process single-window latency) at the
median. Window sets come from the caller (ShareGPT through the training loaders, a JSONL
file, or `worst_case_windows` here).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from predictor.embedders.base import Embedder
from predictor.features import ConversationWindow
from predictor.latency_stats import LatencySummary
from predictor.predictor import Predictor
from predictor.rpc_schema import window_to_json

# Words from several scripts, so synthetic prompts tokenise like real multilingual text.
_SYNTHETIC_TEXT = (
    "the cache evicts blocks when memory runs out and users pause between turns to read "
    "think write again prefix reuse saves prefill time model server request token latency "
    "Warum ist der Himmel blau Erklärung bitte ausführlich 你好 请 解释 一下 缓存 的 原理 "
    "как работает кэш объясни подробно pourquoi la mémoire est limitée ¿cómo funciona? "
    'def main(): return sorted(items, key=lambda x: x[1]) # comment {"json": [1, 2, 3]}'
)
_SYNTHETIC_WORDS = tuple(_SYNTHETIC_TEXT.split(" "))


def worst_case_windows(
    count: int, seed: int = 0, prompts_per_window: int = 5, words_per_prompt: int = 600
) -> list[ConversationWindow]:
    """Windows whose every prompt is longer than its share: each text fills the budget."""
    rng = np.random.default_rng(seed)
    windows = []
    for i in range(count):
        prompts = tuple(
            " ".join(rng.choice(_SYNTHETIC_WORDS, size=words_per_prompt))
            for _ in range(prompts_per_window)
        )
        # a 5-turn chat of long prompts is thousands of serving tokens; the size only feeds a
        # model's log_prompt_tokens input and does not change the cost being measured
        windows.append(
            ConversationWindow(
                f"worst-{seed}-{i}",
                prompts,
                prompts_per_window,
                prompt_tokens=prompts_per_window * words_per_prompt,
            )
        )
    return windows


def synthetic_windows(count: int, seed: int = 0) -> list[ConversationWindow]:
    """Chat-like windows of varied size: 1–6 prompts of 3–150 words, turn counts up to 12."""
    rng = np.random.default_rng(seed)
    windows = []
    for i in range(count):
        turns = int(rng.integers(1, 13))
        kept = min(turns, int(rng.integers(1, 7)))
        prompts = tuple(
            " ".join(rng.choice(_SYNTHETIC_WORDS, size=int(rng.integers(3, 151))))
            for _ in range(kept)
        )
        windows.append(
            ConversationWindow(
                f"synthetic-{seed}-{i}",
                prompts,
                turns,
                prompt_tokens=sum(len(p.split()) for p in prompts),
            )
        )
    return windows


@dataclass
class ThroughputResult:
    items: int
    seconds: float
    items_per_s: float
    latency: LatencySummary  # per call (a batch, or a single item)
    cpu_ms_per_item: float  # this process's CPU time (all threads) per item: load-independent

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _timed_calls(calls: Sequence[Any], fn, items_per_call: Sequence[int]) -> ThroughputResult:
    latencies = []
    cpu_started = time.process_time()
    started = time.perf_counter()
    for argument in calls:
        t0 = time.perf_counter()
        fn(argument)
        latencies.append(time.perf_counter() - t0)
    total = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    items = int(sum(items_per_call))
    return ThroughputResult(
        items,
        round(total, 3),
        round(items / total, 3),
        LatencySummary.of_seconds(latencies),
        round(cpu * 1000 / items, 2),
    )


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far, from /proc (Linux)."""
    import os
    from pathlib import Path

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def token_counts(predictor: Predictor, texts: Sequence[str]) -> dict[str, float]:
    """Tokens the embedder is fed per window (prefix and special tokens included)."""
    counts = np.asarray(predictor.embedder.tokenizer.count_input_tokens(list(texts)))
    return {
        "mean": round(float(counts.mean()), 1),
        "p50": float(np.median(counts)),
        "max": int(counts.max()),
        "min": int(counts.min()),
    }


def bench_embedder(
    embedder: Embedder, texts: Sequence[str], batch_size: int, single_count: int
) -> dict[str, Any]:
    """Batched throughput over all texts, and one-text-per-call latency on the first few."""
    embedder.embed(list(texts[:2]), batch_size=batch_size)  # warm-up
    batches = _chunks(list(texts), batch_size)
    batched = _timed_calls(
        batches, lambda b: embedder.embed(b, batch_size=batch_size), [len(b) for b in batches]
    )
    singles = list(texts[:single_count])
    single = _timed_calls(singles, lambda t: embedder.embed([t], batch_size=1), [1] * len(singles))
    return {"batch_size": batch_size, "batched": batched.as_dict(), "single": single.as_dict()}


def bench_in_process(
    predictor: Predictor, windows: Sequence[ConversationWindow], batch_size: int, single_count: int
) -> tuple[dict[str, Any], np.ndarray]:
    """Single-window latency and batched throughput of `Predictor.predict`; also returns the
    probabilities of all windows (the expected answers for the RPC stages)."""
    predictor.predict(list(windows[:2]))  # warm-up
    expected = np.empty(len(windows))
    batches = _chunks(list(range(len(windows))), batch_size)

    def run_batch(indices: Sequence[int]) -> None:
        expected[list(indices)] = predictor.predict([windows[i] for i in indices])

    batched = _timed_calls(batches, run_batch, [len(b) for b in batches])
    singles = list(windows[:single_count])
    single = _timed_calls(singles, lambda w: predictor.predict([w]), [1] * len(singles))
    return {
        "batch_size": batch_size,
        "batched": batched.as_dict(),
        "single": single.as_dict(),
    }, expected


def bench_stream(predictor: Predictor, windows: Sequence[ConversationWindow]) -> dict[str, Any]:
    """Windows in arrival order (each conversation's turns in sequence), one call each: what
    a server sees. In `prompt_mean` mode the prompt cache starts empty and fills as it goes."""
    predictor.predict(list(windows[:1]))  # warm-up
    if predictor.prompt_cache is not None:
        predictor.prompt_cache.clear()
    result = _timed_calls(
        list(windows), lambda w: predictor.predict([w]), [1] * len(windows)
    ).as_dict()
    if predictor.prompt_cache is not None:
        result["prompt_cache"] = asdict(predictor.prompt_cache.stats)
    return result


def tiny_windows(count: int) -> list[ConversationWindow]:
    """One short prompt each: model time is small, so the RPC's own cost stands out."""
    return [
        ConversationWindow(f"tiny-{i}", (f"hello number {i}",), 1, prompt_tokens=16)
        for i in range(count)
    ]


def server_time_sums(http: httpx.Client) -> dict[str, float]:
    """Sums and counts of the server's predict-request and model-batch latency histograms."""
    wanted = {
        'lpc_predictor_request_latency_seconds_sum{endpoint="predict"}': "request_s",
        'lpc_predictor_request_latency_seconds_count{endpoint="predict"}': "requests",
        "lpc_predictor_batch_latency_seconds_sum": "batch_s",
        "lpc_predictor_batch_latency_seconds_count": "batches",
    }
    sums = dict.fromkeys(wanted.values(), 0.0)
    for line in http.get("/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in wanted:
            sums[wanted[name]] = float(value)
    return sums


def bench_rpc_overhead(
    predictor: Predictor, url: str, windows: Sequence[ConversationWindow], token: str | None = None
) -> dict[str, Any]:
    """Paired latencies: each window in process, then the same window as a lone request to the
    server, alternately; the overhead is the median of the per-window differences (pairing
    cancels slow drifts of a shared machine's load, not its fast noise). Also the server's own
    overhead from its metrics: mean request time minus mean model time per batch (parsing,
    validation, queueing, thread hand-off, serialisation), which machine noise barely moves."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    in_process, rpc = [], []
    with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
        http.post("/v1/predict", json={"items": [window_to_json(windows[0])]})  # warm-up
        predictor.predict([windows[0]])
        before = server_time_sums(http)
        for window in windows:
            t0 = time.perf_counter()
            predictor.predict([window])
            t1 = time.perf_counter()
            response = http.post("/v1/predict", json={"items": [window_to_json(window)]})
            t2 = time.perf_counter()
            response.raise_for_status()
            in_process.append(t1 - t0)
            rpc.append(t2 - t1)
        after = server_time_sums(http)
    differences_ms = (np.asarray(rpc) - np.asarray(in_process)) * 1000.0
    requests = after["requests"] - before["requests"]
    batches = after["batches"] - before["batches"]
    server_overhead_ms = float("nan")
    if requests > 0 and batches > 0:
        server_overhead_ms = 1000.0 * (
            (after["request_s"] - before["request_s"]) / requests
            - (after["batch_s"] - before["batch_s"]) / batches
        )
    return {
        "server_overhead_ms_mean": round(server_overhead_ms, 3),
        "in_process_latency": asdict(LatencySummary.of_seconds(in_process)),
        "rpc_latency": asdict(LatencySummary.of_seconds(rpc)),
        "overhead_ms_p50": round(float(np.median(differences_ms)), 3),
        "overhead_ms_mean": round(float(np.mean(differences_ms)), 3),
    }


def untrained_artifact(
    folder: Path, embedder: Embedder, spec: str, window_encoding: str = "joined"
) -> Path:
    """An MLP with random weights saved as an artifact: speed does not depend on the weights."""
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
