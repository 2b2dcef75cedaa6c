"""Replay an A/B request trace through real vLLM 0.33.0, stock and with the LPC plugin, and
compare both hit ratios with our own replay of the same trace.

Runs in the project's venv and drives vLLM's venv (scripts/setup_vllm_venv.sh) through
scripts/vllm_plugin_replay.py. The trace is a JSONL file as `lpc ab --export-trace` writes it
(format: lpc/traces/lpc_trace.py); each line's `probability` (e.g. from `--trace-probabilities
turns`) is the request's continuation probability, and a missing or null one means the fallback
p.

    .venv/bin/python scripts/vllm_trace_ab.py trace.jsonl --cache-tokens 40000

prints, for LRU (stock vLLM) and LPC (the plugin, `lpc-trace` in our replay), the token hit
ratio of `lpc.replay.simulator.replay` and of real vLLM's `KVCacheManager`, and exits with status 1
if any pair differs by more than --tolerance-points.

With `--access-model DIR` (an access-only artifact) the LPC row is `lpc` instead: the plugin
computes each release's p in process from vLLM's request state and its conversation table,
and our replay takes the model's p from the trace's table (`lpc.access.source`), as
`lpc ab --trace ... --policies lpc --model DIR` does; the trace's own probabilities are unused.
`--evictor lpc-pooled` runs the plugin with that evictor (LPC_EVICTOR) and our replay with
the same one: the LPC row is then `lpc-pooled` (with `--access-model`) or `lpc-pooled-trace`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lpc.drivers.release_plan import PluginSettings  # noqa: E402
from lpc.drivers.trace_stream import hit_totals, trace_stream  # noqa: E402
from lpc.drivers.vllm_driver import run_driver, vllm_python_path  # noqa: E402
from lpc.replay.policies import PolicySpec, parse_policy  # noqa: E402
from lpc.replay.simulator import prepare, replay  # noqa: E402
from lpc.traces.lpc_trace import read_trace  # noqa: E402


def compare(
    trace_path: Path,
    cache_tokens: int,
    block_size: int,
    scale_per_s: float,
    fallback_probability: float,
    vllm_python: Path,
    driver_args: list[str] | None = None,
    access_model: Path | None = None,
    evictor: str = "lpc",
) -> dict[str, Any]:
    """Both replays of the trace; the rows of the comparison and what it cost."""
    started = time.perf_counter()
    trace = read_trace(trace_path)
    requests = trace.requests
    logged = trace.logged_probabilities or [None] * len(requests)
    sources: dict[str, list[float | None]] = {"trace": logged}
    lpc_label = "lpc-trace"
    if access_model is not None:
        from lpc.access.source import AccessSource
        from predictor.access_predictor import AccessPredictor

        source = AccessSource(AccessPredictor.load(access_model))
        sources["model"] = source.predict_requests(requests)
        logged = [None] * len(requests)  # the plugin predicts every release itself
        lpc_label = "lpc"
        driver_args = [*(driver_args or []), "--access-model", str(access_model.resolve())]
    lpc_spec = parse_policy(lpc_label)
    if evictor != "lpc":
        lpc_label = "lpc-pooled" if lpc_label == "lpc" else f"{evictor}-trace"
        lpc_spec = PolicySpec(lpc_label, evictor, lpc_spec.source)
        driver_args = [*(driver_args or []), "--evictor", evictor]
    workload = prepare(requests, block_size, sources)
    ours = {
        label: replay(workload, spec, cache_tokens, scale_per_s, fallback_probability)
        for label, spec in (("lru", parse_policy("lru")), (lpc_label, lpc_spec))
    }
    our_seconds = time.perf_counter() - started
    stream, plan = trace_stream(workload, cache_tokens, logged)
    settings = PluginSettings(scale_per_s, fallback_probability)
    with tempfile.TemporaryDirectory(prefix="lpc-vllm-trace-") as workdir:
        run = run_driver(
            vllm_python,
            [stream],
            {stream.config.name: plan},
            Path(workdir),
            settings,
            extra_args=["--outcomes-only", *(driver_args or [])],
        )
    vllm = {
        "lru": hit_totals(stream, run.stock[stream.config.name]),
        lpc_label: hit_totals(stream, run.plugin[stream.config.name]),
    }
    rows = []
    for label, engine in (("lru", "stock vLLM"), (lpc_label, "vLLM + LPC plugin")):
        a, b = ours[label], vllm[label]
        rows.append(
            {
                "policy": label,
                "vllm": engine,
                "ours_hit_ratio": a.token_hit_ratio,
                "vllm_hit_ratio": b.token_hit_ratio,
                "difference_points": 100 * (b.token_hit_ratio - a.token_hit_ratio),
                "ours_hit_tokens": a.hit_tokens,
                "vllm_hit_tokens": b.hit_tokens,
                "queried_tokens": a.queried_tokens,
                "ours_evictions": a.evictions,
                "vllm_evictions": b.evictions,
                "ours_failures": a.allocation_failures,
                "vllm_failures": b.allocation_failures,
            }
        )
    return {
        "trace": str(trace_path),
        "requests": len(requests),
        "requests_with_probability": sum(p is not None for p in logged),
        "cache_tokens": cache_tokens,
        "block_size": block_size,
        "scale_per_s": scale_per_s,
        "fallback_probability": fallback_probability,
        "rows": rows,
        "our_seconds": round(our_seconds, 2),
        "vllm_wall_seconds": round(run.wall_seconds, 2),
        "vllm": {k: v for k, v in run.summary.items() if k != "plugin_stats"},
        "plugin_stats": run.summary.get("plugin_stats", {}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("trace", type=Path, help="JSONL trace (lpc ab --export-trace)")
    parser.add_argument("--cache-tokens", type=int, required=True, help="KV cache size in tokens")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (16)")
    parser.add_argument("--scale", type=float, default=1e-2, help="LPC decay scale per second")
    parser.add_argument(
        "--fallback-p", type=float, default=0.5, help="p of requests without a probability"
    )
    parser.add_argument(
        "--tolerance-points", type=float, default=0.1, help="allowed difference (0.1 points)"
    )
    parser.add_argument(
        "--vllm-python", type=Path, default=None, help="python of vLLM's venv (.vllm-venv)"
    )
    parser.add_argument(
        "--request-log-dir",
        type=Path,
        help="the plugin writes its request log here (replay it with lpc ab --trace DIR)",
    )
    parser.add_argument(
        "--request-log-text", action="store_true", help="the request log records user prompts"
    )
    parser.add_argument(
        "--access-model",
        type=Path,
        help="an access-only artifact: the plugin predicts with it in process (row `lpc`)",
    )
    parser.add_argument(
        "--evictor",
        choices=("lpc", "lpc-pooled"),
        default="lpc",
        help="the learned evictor of the plugin and of our LPC replay (lpc)",
    )
    parser.add_argument(
        "--conversation-table-max-tokens",
        type=int,
        help="previous-request tokens the plugin's conversation table keeps for the access "
        "model (LPC_CONVERSATION_TABLE_MAX_TOKENS; the plugin's default when not given)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    python = args.vllm_python or vllm_python_path()
    if not python.exists():
        print(f"vllm_trace_ab: no vLLM python at {python}; run scripts/setup_vllm_venv.sh")
        return 2
    driver_args = []
    if args.request_log_dir is not None:
        driver_args += ["--request-log-dir", str(args.request_log_dir.resolve())]
    if args.request_log_text:
        driver_args.append("--request-log-text")
    if args.conversation_table_max_tokens is not None:
        driver_args += ["--conversation-table-max-tokens", str(args.conversation_table_max_tokens)]
    result = compare(
        args.trace,
        args.cache_tokens,
        args.block_size,
        args.scale,
        args.fallback_p,
        python,
        driver_args,
        args.access_model,
        args.evictor,
    )
    worst = max(abs(row["difference_points"]) for row in result["rows"])
    result["agree"] = worst <= args.tolerance_points
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['trace']}: {result['requests']} requests "
            f"({result['requests_with_probability']} with a probability), "
            f"{result['cache_tokens']} tokens of cache, block size {result['block_size']}"
        )
        print(f"{'policy':<10} {'vLLM':<18} {'ours':>8} {'vLLM':>8} {'diff (pts)':>10}")
        for row in result["rows"]:
            print(
                f"{row['policy']:<10} {row['vllm']:<18} {100 * row['ours_hit_ratio']:7.3f}% "
                f"{100 * row['vllm_hit_ratio']:7.3f}% {row['difference_points']:10.4f}"
            )
        stats = result["plugin_stats"]
        print(
            f"plugin: {stats.get('releases', 0)} releases, p from request "
            f"{stats.get('probabilities_from_request', 0)}, fallback "
            f"{stats.get('fallbacks_used', 0)}, evictions {stats.get('evictions', 0)}; "
            f"ours {result['our_seconds']}s, vLLM driver {result['vllm_wall_seconds']}s"
        )
        print("AGREE" if result["agree"] else f"DISAGREE (tolerance {args.tolerance_points})")
    return 0 if result["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
