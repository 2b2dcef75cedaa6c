"""Replay an A/B request trace through SGLang 0.5.23's real radix cache, stock LRU and with
the LPC strategy, and compare both hit ratios with our own replay of the same trace.

Runs in the project's venv and drives SGLang's venv (scripts/setup_sglang_venv.sh) through
scripts/sglang_radix_replay.py. The trace is any JSONL file as `lpc ab --export-trace`
writes it (format: docs/traces.md); each line's `probability` (e.g. from
`--trace-probabilities model`) is the request's continuation probability, sent to SGLang as
the request's `priority` in parts per million; a missing or null one means the fallback p.

    .venv/bin/python scripts/sglang_trace_ab.py trace.jsonl --cache-tokens 60000

prints, for LRU (SGLang's stock `lru` policy) and LPC (`--radix-eviction-policy lpc`;
`lpc-trace` in our replay), the token hit ratio of `lpc.replay.simulator.replay` (at each of
--our-block-sizes) beside SGLang's `UnifiedRadixCache` (or `RadixCache`, --kind radix).
SGLang's tree is token-granular (page size 1), evicts whole leaf nodes and pools p by max
without decay, so it is not expected to equal our block manager; docs/serving.md explains
the differences. Exit status 0 when both replays ran, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lpc.drivers.sglang_radix import KINDS, sglang_python_path  # noqa: E402
from lpc.integrations.sglang_strategy import probability_to_priority  # noqa: E402
from lpc.replay.policies import parse_policy  # noqa: E402
from lpc.replay.simulator import prepare, replay  # noqa: E402
from lpc.traces.lpc_trace import TraceError, read_trace  # noqa: E402

# (our policy, SGLang's policy, label, SGLang's clock): "trace" puts the trace's seconds on
# the nodes; "sglang" keeps UnifiedRadixCache's own tick counter, as a served SGLang runs.
POLICIES = (
    ("lru", "lru", "SGLang lru", "trace"),
    ("lpc-trace", "lpc", "SGLang + LPC", "trace"),
)
TICK_ROW = ("lpc-trace", "lpc", "SGLang + LPC, ticks", "sglang")


class SGLangReplayFailed(RuntimeError):
    """SGLang's replay process exited with an error; the message ends with its stderr."""


def run_sglang(
    python: Path, stream: dict[str, Any], timeout_s: float = 3600
) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="lpc-sglang-trace-") as workdir:
        stream_path, out_path = Path(workdir, "stream.json"), Path(workdir, "out.json")
        stream_path.write_text(json.dumps(stream))
        done = subprocess.run(
            [
                str(python),
                str(REPO / "scripts" / "sglang_radix_replay.py"),
                str(stream_path),
                str(out_path),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=REPO,
            check=False,
        )
        if done.returncode != 0:
            raise SGLangReplayFailed(
                f"SGLang replay failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
            )
        return json.loads(out_path.read_text())


def compare(
    trace_path: Path,
    cache_tokens: int,
    our_block_sizes: list[int],
    scale_per_s: float,
    fallback_probability: float,
    kind: str,
    sglang_python: Path,
    with_ticks: bool = False,
) -> dict[str, Any]:
    """Both replays of the trace; the rows of the comparison and what it cost."""
    started = time.perf_counter()
    trace = read_trace(trace_path)
    requests = trace.requests
    for request in requests:
        if request.turn.lora_id is not None:
            raise TraceError(
                f"{trace_path}: request {request.request_id} uses LoRA "
                f"{request.turn.lora_id!r}; the SGLang replay does not load adapters"
            )
    logged = trace.logged_probabilities or [None] * len(requests)
    ours: dict[int, dict[str, Any]] = {}
    workload = None
    for block_size in our_block_sizes:
        workload = prepare(requests, block_size, {"trace": logged})
        ours[block_size] = {
            label: replay(
                workload, parse_policy(label), cache_tokens, scale_per_s, fallback_probability
            )
            for label, _, _, _ in POLICIES
        }
    assert workload is not None
    our_seconds = time.perf_counter() - started
    rows_wanted = POLICIES + ((TICK_ROW,) if with_ticks else ())
    # The trace's p ride in `priority` as a router that sets it would (trusted: the strategy's
    # trust boundary).
    config = {
        "scale_per_s": scale_per_s,
        "fallback_probability": fallback_probability,
        "trust_request_priority": True,
    }
    stream = {
        "capacity_tokens": cache_tokens,
        "kind": kind,
        "policies": [
            [engine, policy, config if policy == "lpc" else None, clock]
            for _, policy, engine, clock in rows_wanted
        ],
        "requests": [
            {
                "tokens": list(request.turn.token_ids),
                "prompt_len": request.turn.num_prompt_tokens,
                "priority": 0 if p is None else probability_to_priority(p),
                "cache_salt": request.turn.cache_salt,
            }
            for request, p in zip(requests, logged, strict=True)
        ],
        "events": workload.events,  # the order our replay walks: same for every block size
    }
    started = time.perf_counter()
    sglang = run_sglang(sglang_python, stream)
    sglang_seconds = time.perf_counter() - started
    rows = []
    for label, _, engine, clock in rows_wanted:
        s = sglang[engine]
        queried = s["queried_tokens"]
        row: dict[str, Any] = {
            "policy": label,
            "sglang": engine,
            "sglang_clock": clock,
            "sglang_hit_ratio": s["hit_tokens"] / queried if queried else 0.0,
            "sglang_hit_tokens": s["hit_tokens"],
            "queried_tokens": queried,
            "sglang_evicted_nodes": s["evicted_nodes"],
            "sglang_evicted_tokens": s["evicted_tokens"],
            "sglang_evict_requested_tokens": s["evict_requested_tokens"],
            "sglang_ticks": s["ticks"],
            "sglang_mean_free_slots": s["free_slots_after_arrivals"]
            / max(s["arrivals_after_first_eviction"], 1),
            "sglang_failures": s["allocation_failures"],
            "sglang_slots_accounted": s["slots_accounted"],
            "sglang_strategy": s["strategy"],
            "sglang_cache": s["cache"],
        }
        for block_size, results in ours.items():
            a = results[label]
            assert a.queried_tokens == queried, (a.queried_tokens, queried)
            row[f"ours_b{block_size}_hit_ratio"] = a.token_hit_ratio
            row[f"ours_b{block_size}_evicted_blocks"] = a.evictions
            row[f"ours_b{block_size}_failures"] = a.allocation_failures
        rows.append(row)
    return {
        "trace": str(trace_path),
        "requests": len(requests),
        "requests_with_probability": sum(p is not None for p in logged),
        "cache_tokens": cache_tokens,
        "our_block_sizes": our_block_sizes,
        "sglang_page_size": 1,
        "sglang_kind": kind,
        "trace_seconds": workload.events[-1][0] - workload.events[0][0],
        "scale_per_s": scale_per_s,
        "fallback_probability": fallback_probability,
        "rows": rows,
        "our_seconds": round(our_seconds, 2),
        "sglang_wall_seconds": round(sglang_seconds, 2),
    }


def parse_block_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not sizes or any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"block sizes must be >= 1, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trace", type=Path, help="JSONL trace (lpc ab --export-trace)")
    parser.add_argument("--cache-tokens", type=int, required=True, help="KV cache size in tokens")
    parser.add_argument(
        "--our-block-sizes",
        type=parse_block_sizes,
        default=[16, 1],
        help="block sizes of our replay, comma-separated (16,1: vLLM's, and token-granular)",
    )
    parser.add_argument("--scale", type=float, default=1e-2, help="LPC decay scale per second")
    parser.add_argument(
        "--fallback-p", type=float, default=0.5, help="p of requests without a probability"
    )
    parser.add_argument(
        "--kind", choices=KINDS, default="unified", help="SGLang's tree (unified: served models')"
    )
    parser.add_argument(
        "--with-ticks",
        action="store_true",
        help="also replay LPC on UnifiedRadixCache's own tick counter (scale then per tick)",
    )
    parser.add_argument(
        "--sglang-python", type=Path, default=None, help="python of SGLang's venv (.sglang-venv)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if args.with_ticks and args.kind != "unified":
        parser.error("--with-ticks needs --kind unified (RadixCache's clock is wall time)")
    if args.cache_tokens < 1:
        parser.error(f"--cache-tokens must be >= 1, got {args.cache_tokens}")
    python = args.sglang_python or sglang_python_path()
    if not python.exists():
        print(f"sglang_trace_ab: no SGLang python at {python}; run scripts/setup_sglang_venv.sh")
        return 2
    try:
        result = compare(
            args.trace,
            args.cache_tokens,
            args.our_block_sizes,
            args.scale,
            args.fallback_p,
            args.kind,
            python,
            args.with_ticks,
        )
    except TraceError as error:
        print(f"sglang_trace_ab: error: {error}")
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    sizes = result["our_block_sizes"]
    print(
        f"{result['trace']}: {result['requests']} requests "
        f"({result['requests_with_probability']} with a probability), "
        f"{result['cache_tokens']} tokens of cache; SGLang {result['rows'][0]['sglang_cache']} "
        f"page size 1; ours at block size {', '.join(map(str, sizes))}"
    )
    header = f"{'policy':<10} {'SGLang':<20}" + "".join(f" {f'ours b{b}':>9}" for b in sizes)
    print(header + f" {'SGLang':>8}" + "".join(f" {f'diff b{b}':>8}" for b in sizes))
    for row in result["rows"]:
        s = 100 * row["sglang_hit_ratio"]
        ours = [100 * row[f"ours_b{b}_hit_ratio"] for b in sizes]
        print(
            f"{row['policy']:<10} {row['sglang']:<20}"
            + "".join(f" {o:8.3f}%" for o in ours)
            + f" {s:7.3f}%"
            + "".join(f" {s - o:+8.3f}" for o in ours)
        )
    for row in result["rows"]:
        print(
            f"{row['sglang']}: evicted {row['sglang_evicted_nodes']} nodes "
            f"({row['sglang_evicted_tokens']} tokens for {row['sglang_evict_requested_tokens']} "
            f"asked; {row['sglang_mean_free_slots']:.0f} slots free after an arrival "
            f"once full, on average), {row['sglang_failures']} allocation "
            f"failures, strategy {row['sglang_strategy']}, slots accounted "
            f"{row['sglang_slots_accounted']}; ours b{sizes[0]} evicted "
            f"{row[f'ours_b{sizes[0]}_evicted_blocks']} blocks, "
            f"{row[f'ours_b{sizes[0]}_failures']} failures"
        )
    for row in result["rows"]:
        if row["sglang_clock"] != "sglang":
            continue
        ticks = row["sglang_ticks"]
        print(
            f"{row['sglang']}: the access counter ran {ticks:.0f} ticks over "
            f"{result['trace_seconds']:.0f} trace seconds "
            f"({ticks / max(result['trace_seconds'], 1e-9):.1f} per second)"
        )
    print(f"ours {result['our_seconds']}s, SGLang {result['sglang_wall_seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
