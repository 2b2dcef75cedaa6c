"""Serve a request trace with vLLM 0.33.0's own scheduler, stock and with the LPC plugin.

Runs in the project's venv and drives vLLM's venv (scripts/setup_vllm_plugin.sh) through
scripts/vllm_scheduler_replay.py, one process per policy: vLLM's `Scheduler` on the CPU with
chunked prefill, a token budget, a KV pool and a step-time model, fed synthetic model outputs
(the trace's output tokens) on a simulated clock; requests arrive on the trace's timeline.

    .venv/bin/python scripts/vllm_scheduler_ab.py mooncake --kv-tokens 400000 --block-size 512 \\
        --max-num-batched-tokens 8192 --max-num-seqs 128 --access-model models/mooncake-access

TRACE is a JSONL file as `lpc ab --export-trace` writes it (any format `lpc ab --trace`
reads) or a bundled trace (`mooncake`, `mooncake-synthetic`). Policies: `lru` (stock vLLM),
`lpc-const[=P]` (the plugin, one p for every release), `lpc` and `lpc-pooled` (the plugin's
learned evictors: p from `--access-model` in process, else each line's `probability`, sent
as the request's `lpc_probability`; a line without one gets the fallback p), `shadow` and
`shadow-pooled` (the plugin in shadow mode: stock vLLM's eviction, while metadata-only `lpc`
or `lpc-pooled` and LRU caches replay the same requests with the learned policies' p).
`--switch-at STEP:MODE,...` switches the learned policies' mode (lpc, lru, shadow) before those
steps: the kill switch, while the engine runs.

Reported per policy: the token hit ratio of vLLM's own `SchedulerStats` (prefix-cache hits /
queries of first admissions, as `vllm:prefix_cache_hits` / `vllm:prefix_cache_queries`
count them; a preempted request's second lookup is counted apart), steps, preemptions,
tokens recomputed after a preemption, chunked prefills (prefills spread over several steps),
evictions; a shadow's two hit ratios. Checked: `lpc-const`, `shadow` and `shadow-pooled`
schedule exactly as `lru` at every step (tokens per request, preemptions, prefix hits, the
blocks allocated); while a plugin run is in lru or shadow mode, each block it evicts is the one
stock vLLM's `FreeKVCacheBlockQueue`, fed the same calls, evicts; a shadow's figures equal our
replay of its requests (`lpc.replay.shadow`); every run ends with each block free, every
reference count zero and the free queue holding each block once. Exit status 1 if a check
fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lpc.drivers.vllm_driver import vllm_python_path  # noqa: E402
from lpc.drivers.vllm_scheduler import (  # noqa: E402
    LEARNED,
    SHADOW,
    EngineSettings,
    PolicyRun,
    PolicySettings,
    SchedulerRunFailed,
    first_divergence,
    parse_policies,
    policy_row,
    run_policy,
    settings_dict,
    shadow_replay_check,
    write_requests,
)

# The fields of a step record that must be equal when one constant p makes LPC order blocks
# by release time, as LRU does: everything the scheduler decided in the step.
PARITY_FIELDS = (
    "t",
    "scheduled",
    "partial",
    "new",
    "resumed",
    "preempted",
    "blocks",
    "recomputed",
    "hits",
    "free",
    "finished",
)


def keep_conversation(conversation_id: str, one_in: int) -> bool:
    """scripts/sample_conversations.py's stable rule: crc32 of the id."""
    return zlib.crc32(conversation_id.encode("utf-8")) % one_in == 0


def load_requests(spec: str, one_in: int) -> tuple[list[Any], list[float | None] | None, str]:
    """The trace's requests (one conversation in `one_in`), their logged probabilities, and
    the file it came from."""
    from lpc.traces.load import TraceOptions, load_trace

    trace = load_trace(spec, TraceOptions())
    requests, logged = trace.requests, trace.logged_probabilities
    if one_in > 1:
        kept = [i for i, r in enumerate(requests) if keep_conversation(r.conversation_id, one_in)]
        requests = [requests[i] for i in kept]
        logged = [logged[i] for i in kept] if logged is not None else None
    return requests, logged, str(trace.path)


def compare(
    trace: str,
    policies_text: str,
    engine: EngineSettings,
    settings: PolicySettings,
    vllm_python: Path,
    one_in: int = 1,
    records_dir: Path | None = None,
    jobs: int = 1,
    switch_at: str = "",
) -> dict[str, Any]:
    """Every policy's run of the trace through vLLM's scheduler, and the checks."""
    policies = parse_policies(policies_text)
    started = time.perf_counter()
    requests, logged, path = load_requests(trace, one_in)
    if not requests:
        raise ValueError(f"{trace}: no request kept")
    with tempfile.TemporaryDirectory(prefix="lpc-vllm-scheduler-") as scratch:
        workdir = records_dir if records_dir is not None else Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        requests_file = write_requests(workdir / "requests.jsonl", requests, logged)
        prepare_seconds = time.perf_counter() - started

        def run(policy: Any) -> PolicyRun:
            switches = switch_at if policy.name in LEARNED else ""
            return run_policy(
                vllm_python, requests_file, policy, engine, settings, workdir, switch_at=switches
            )

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            runs = list(pool.map(run, policies))
        by_label = {r.policy.label: r for r in runs}
        checks: dict[str, Any] = {
            "invariants": {r.policy.label: r.summary["invariants"]["ok"] for r in runs},
            "every_request_finished": {
                r.policy.label: r.totals["finished"] == len(requests) for r in runs
            },
        }
        lru = next((r for r in runs if r.policy.name == "lru"), None)
        for run_ in runs:
            check = run_.summary.get("lru_order_check")
            if check is not None:
                checks.setdefault("lru_order", {})[run_.policy.label] = check
            if run_.policy.name in SHADOW:
                checks[f"{run_.policy.label}_equals_replay"] = shadow_replay_check(
                    run_, requests_file.path
                )
            if run_.policy.name not in ("lpc-const", *SHADOW) or lru is None:
                continue
            assert run_.records is not None and lru.records is not None
            divergence = first_divergence(lru.records, run_.records, PARITY_FIELDS)
            checks[f"{run_.policy.label}_equals_lru"] = {
                "equal": divergence is None,
                "first_divergence": divergence,
                "steps_compared": run_.totals["steps"],
            }
    if settings.access_model is not None:
        p_source = f"access model {settings.access_model} in process"
    elif requests_file.with_probability:
        p_source = (
            f"the trace's probability ({requests_file.with_probability} of "
            f"{requests_file.requests} requests; the rest the fallback p)"
        )
    else:
        p_source = "none in the trace and no access model: every release the fallback p"
    ok = all(checks["invariants"].values()) and all(checks["every_request_finished"].values())
    ok = ok and all(
        value["equal"] for key, value in checks.items() if key.endswith(("_equals_lru", "_replay"))
    )
    ok = ok and all(c["lru_mismatches"] == 0 for c in checks.get("lru_order", {}).values())
    return {
        "trace": path,
        "one_in": one_in,
        "requests": requests_file.requests,
        "prompt_tokens": requests_file.prompt_tokens,
        "output_tokens": requests_file.output_tokens,
        "longest_request_tokens": requests_file.longest_tokens,
        "learned_p_source": (
            p_source if any(p.name in (*LEARNED, *SHADOW) for p in policies) else None
        ),
        "switch_at": switch_at or None,
        "settings": settings_dict(engine, settings),
        "rows": [policy_row(r) for r in runs],
        "checks": checks,
        "ok": ok,
        "prepare_seconds": round(prepare_seconds, 2),
        "wall_seconds": round(time.perf_counter() - started, 2),
        "vllm": {
            label: {
                "version": r.summary["vllm_version"],
                "scheduler": r.summary["scheduler"],
                "queue": r.summary["invariants"]["queue"],
                "data_parallel": [
                    r.summary["config"]["data_parallel_size"],
                    r.summary["config"]["data_parallel_rank"],
                ],
                "import_seconds": r.summary["import_seconds"],
                "environment": r.environment,
            }
            for label, r in by_label.items()
        },
    }


def print_table(result: dict[str, Any]) -> None:
    sample = "" if result["one_in"] == 1 else f" (1 conversation in {result['one_in']})"
    print(
        f"{result['trace']}{sample}: {result['requests']} requests, "
        f"{result['prompt_tokens']:,} prompt tokens, {result['output_tokens']:,} output tokens"
    )
    s = result["settings"]
    print(
        f"vLLM Scheduler: KV {s['kv_tokens']:,} tokens ({s['num_blocks'] - 1} blocks of "
        f"{s['block_size']}), token budget {s['max_num_batched_tokens']}, max {s['max_num_seqs']} "
        f"sequences; step {1000 * s['step_base_s']:g} ms + "
        f"{1e6 * s['step_per_token_s']:g} us/token"
    )
    if result["learned_p_source"]:
        print(f"lpc, lpc-pooled p: {result['learned_p_source']}")
    header = (
        f"{'policy':<14} {'hit ratio':>9} {'steps':>8} {'preempt':>8} {'recomputed':>11} "
        f"{'(evicted)':>10} {'chunked':>8} {'evictions':>10} {'invariants':>10}"
    )
    print(header)
    for row in result["rows"]:
        print(
            f"{row['policy']:<14} {100 * row['hit_ratio']:8.3f}% {row['steps']:>8} "
            f"{row['preemptions']:>8} {row['recomputed_tokens']:>11} "
            f"{row['recomputed_evicted_tokens']:>10} {row['chunked_prefills']:>8} "
            f"{row['evictions']:>10} "
            f"{'ok' if row['invariants_ok'] else 'BROKEN':>10}"
        )
    for row in result["rows"]:
        if "shadow_queries" in row:
            print(
                f"{row['policy']}: shadow hit ratio lpc {100 * row['shadow_lpc_hit_ratio']:.3f}%, "
                f"lru {100 * row['shadow_lru_hit_ratio']:.3f}% ({row['shadow_requests']} "
                f"requests, {row['shadow_queries']:,} tokens looked up)"
            )
        if row.get("mode_switches"):
            print(f"{row['policy']}: mode switches {row['mode_switches']}")
    for label, check in result["checks"].get("lru_order", {}).items():
        print(
            f"{label}: {check['lru_pops']} blocks handed out in LRU order, "
            f"{check['lru_mismatches']} unlike stock vLLM's queue; "
            f"{check['lpc_pops']} in LPC order ({check['lpc_not_lru']} unlike LRU)"
        )
    for key, value in result["checks"].items():
        if key.endswith("_equals_replay"):
            verdict = "equal" if value["equal"] else f"DIFFERENT: {value['shadow_vs_replay']}"
            print(f"{key.removesuffix('_equals_replay')} shadow vs our replay: {verdict}")
        if key.endswith("_equals_lru"):
            verdict = (
                f"equal at all {value['steps_compared']} steps"
                if value["equal"]
                else f"DIFFERENT: {value['first_divergence']}"
            )
            print(f"{key.removesuffix('_equals_lru')} vs lru: {verdict}")
    print(f"wall {result['wall_seconds']}s; {'OK' if result['ok'] else 'CHECK FAILED'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("trace", help="JSONL trace (lpc ab --export-trace) or a bundled name")
    parser.add_argument(
        "--policies",
        default="lru,lpc-const,lpc,lpc-pooled",
        help="lru, lpc-const[=P], lpc, lpc-pooled, shadow, shadow-pooled (default: the first four)",
    )
    parser.add_argument(
        "--switch-at",
        default="",
        help="STEP:MODE[,STEP:MODE...]: switch lpc and lpc-pooled to MODE (lpc, lru, shadow) "
        "before that step, as the control file does in a deployment",
    )
    parser.add_argument("--kv-tokens", type=int, required=True, help="KV pool size in tokens")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (16)")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=2048, help="token budget per step (2048)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=64, help="running requests (64)")
    parser.add_argument(
        "--max-model-len", type=int, help="default: the longest request, rounded up to a block"
    )
    parser.add_argument(
        "--step-base-ms", type=float, default=10.0, help="step time: fixed part (10 ms)"
    )
    parser.add_argument(
        "--step-per-token-us",
        type=float,
        default=10.0,
        help="step time: per scheduled token (10 us)",
    )
    parser.add_argument("--scale", type=float, default=1e-2, help="LPC decay scale per second")
    parser.add_argument("--fallback-p", type=float, default=0.5, help="the plugin's fallback p")
    parser.add_argument(
        "--access-model",
        type=Path,
        help="lpc and lpc-pooled predict each release with this access-only model in process "
        "(LPC_ACCESS_MODEL); without it, each line's probability",
    )
    parser.add_argument(
        "--conversation-table-max-tokens",
        type=int,
        help="the plugin's LPC_CONVERSATION_TABLE_MAX_TOKENS (its default when not given)",
    )
    parser.add_argument(
        "--one-in", type=int, default=1, help="keep one conversation in N (stable crc32)"
    )
    parser.add_argument(
        "--check-every",
        type=int,
        default=0,
        help="also check block ownership and reference counts every N steps (0: at the end)",
    )
    parser.add_argument(
        "--data-parallel",
        metavar="SIZE:RANK",
        help="serve the trace with the scheduler of rank RANK of a SIZE-rank data-parallel "
        "engine (what that rank's engine core builds; default: no data parallelism)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="policies run at once (1)")
    parser.add_argument("--records-dir", type=Path, help="keep the per-step records here")
    parser.add_argument("--vllm-python", type=Path, help="python of vLLM's venv (.vllm-venv)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if args.one_in < 1:
        parser.error(f"--one-in must be >= 1, got {args.one_in}")
    dp_size, dp_rank = 1, 0
    if args.data_parallel is not None:
        size, _, rank = args.data_parallel.partition(":")
        if not (size.isdigit() and rank.isdigit() and 0 <= int(rank) < int(size)):
            parser.error(
                f"--data-parallel must be SIZE:RANK with 0 <= RANK < SIZE, got "
                f"{args.data_parallel!r}"
            )
        dp_size, dp_rank = int(size), int(rank)
    python = args.vllm_python or vllm_python_path()
    if not python.exists():
        print(f"vllm_scheduler_ab: no vLLM python at {python}; run scripts/setup_vllm_plugin.sh")
        return 2
    engine = EngineSettings(
        kv_tokens=args.kv_tokens,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        step_base_s=args.step_base_ms / 1e3,
        step_per_token_s=args.step_per_token_us / 1e6,
        max_model_len=args.max_model_len,
        check_every=args.check_every,
        data_parallel_size=dp_size,
        data_parallel_rank=dp_rank,
    )
    settings = PolicySettings(
        scale_per_s=args.scale,
        fallback_probability=args.fallback_p,
        access_model=args.access_model,
        conversation_table_max_tokens=args.conversation_table_max_tokens,
    )
    try:
        result = compare(
            args.trace,
            args.policies,
            engine,
            settings,
            python,
            args.one_in,
            args.records_dir,
            args.jobs,
            args.switch_at,
        )
    except (ValueError, SchedulerRunFailed) as error:
        print(f"vllm_scheduler_ab: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
