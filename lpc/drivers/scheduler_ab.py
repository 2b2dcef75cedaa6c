"""`lpc vllm-ab`'s engine: serve a request trace with vLLM 0.33.0's own scheduler, stock and
with the LPC plugin, and check the runs against each other.

Runs in the project's venv and drives vLLM's venv (scripts/setup_vllm_plugin.sh) through
scripts/vllm_scheduler_replay.py, one process per policy (`lpc.drivers.vllm_scheduler`):
vLLM's `Scheduler` on the CPU with chunked prefill, a token budget, a KV pool and a step-time
model, fed synthetic model outputs (the trace's output tokens) on a simulated clock; requests
arrive on the trace's timeline. What is reported and checked: `lpc.cli.vllm_ab`'s help and
docs/serving.md ("vLLM's own scheduler on the CPU: chunked prefill, preemption, arrivals on
the clock").
"""

from __future__ import annotations

import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lpc.drivers.release_plan import PluginSettings
from lpc.drivers.step_interleave import floor_check, interleaved_check, print_interleaved
from lpc.drivers.vllm_scheduler import (
    LEARNED,
    PLUGIN_TIMERS,
    SCHEDULER_CLASS_PATH,
    SEAM_PATH,
    SHADOW,
    EngineSettings,
    PolicyRun,
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


# How the report names the plugin's path into vLLM (`PolicyRun.through`).
THROUGH_TEXT = {
    SCHEDULER_CLASS_PATH: "vLLM's --scheduler-cls LPCScheduler (--additional-config lpc table)",
    SEAM_PATH: "vLLM's eviction-policy seam (LPC_* environment)",
}


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
    settings: PluginSettings,
    vllm_python: Path,
    one_in: int = 1,
    records_dir: Path | None = None,
    jobs: int = 1,
    switch_at: str = "",
    time_steps: bool = False,
    interleave: bool = False,
) -> dict[str, Any]:
    """Every policy's run of the trace through vLLM's scheduler, and the checks;
    `time_steps`: each run's scheduler CPU per step, and its ratio to `lru`'s;
    `interleave`: each plugin policy's run steps stock vLLM beside it in its process
    (`lpc.drivers.step_interleave`)."""
    policies = parse_policies(policies_text)
    if interleave and any(p.name in ("lru", "installed") for p in policies):
        raise ValueError(
            "--interleave runs stock vLLM beside each plugin policy (and floor): leave lru out"
        )
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
                vllm_python,
                requests_file,
                policy,
                engine,
                settings,
                workdir,
                switch_at=switches,
                time_steps=time_steps,
                interleave=interleave,
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
            if "interleaved" in run_.summary:
                checks[f"{run_.policy.label}_interleaved"] = interleaved_check(run_.summary)
                if run_.policy.name == "floor":  # it evicts in vLLM's order: the same run
                    checks["floor_equals_lru"] = floor_check(run_.summary)
            if run_.policy.name in SHADOW:
                checks[f"{run_.policy.label}_equals_replay"] = shadow_replay_check(
                    run_, requests_file.path
                )
            if run_.policy.name not in ("installed", "floor", "lpc-const", *SHADOW) or lru is None:
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
    ok = ok and all(value["ok"] for key, value in checks.items() if key.endswith("_interleaved"))
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
        "interleaved": interleave,
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
                "through": r.through,
                "additional_config": r.additional_config,
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
    through = sorted({v["through"] for v in result["vllm"].values() if v["through"]})
    if through:
        print(f"the plugin's policies ran through: {', '.join(THROUGH_TEXT[t] for t in through)}")
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
    print_scheduler_cpu(result["rows"])
    for row in result["rows"]:
        if row.get("interleaved"):
            print_interleaved(row["policy"], row["interleaved"])
        print_plugin_timers(row)
    print(f"wall {result['wall_seconds']}s; {'OK' if result['ok'] else 'CHECK FAILED'}")


def print_plugin_timers(row: dict[str, Any]) -> None:
    """The plugin's own timers for a policy that ran it with `--time-steps`: where its share
    of the scheduler thread went."""
    timers = row.get("plugin_timers")
    if not timers or not row.get("scheduler_cpu"):
        return
    scoring, free, release = (
        timers.get(name, {"total_s": 0.0, "count": 0}) for name in PLUGIN_TIMERS
    )
    print(
        f"{row['policy']}: the plugin's timers: {scoring['total_s']:.3f} s in "
        f"{scoring['count']} scoring passes, {free['total_s']:.3f} s in {free['count']} frees "
        f"(vLLM's own loop included), of which {release['total_s']:.3f} s in "
        f"{release['count']} releases"
    )


def print_scheduler_cpu(rows: list[dict[str, Any]]) -> None:
    """Each policy's scheduler CPU (`--time-steps`), and its ratio to lru's."""
    base = next((r["scheduler_cpu"] for r in rows if r["policy"] == "lru"), None)
    for row in rows:
        cpu = row.get("scheduler_cpu")
        if not cpu:
            continue
        ratio = ""
        if base and base["total_s"] > 0 and row["policy"] != "lru":
            ratio = (
                f"; {cpu['total_s'] / base['total_s']:.3f}x lru in all, "
                f"{cpu['step_p50_us'] / max(base['step_p50_us'], 1e-9):.3f}x at p50"
            )
        print(
            f"{row['policy']}: scheduler CPU {cpu['total_s']:.3f} s over {cpu['steps']} steps "
            f"(p50 {cpu['step_p50_us']:.0f} us, p99 {cpu['step_p99_us']:.0f} us){ratio}"
        )
