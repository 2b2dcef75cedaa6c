"""vLLM 0.33.0's own `Scheduler` on the CPU, stock and with the LPC plugin loaded by vLLM.

`scripts/vllm_scheduler_ab.py` serves a trace through `vllm.v1.core.sched.scheduler.Scheduler`
(chunked prefill, a small token budget, a KV pool small enough to preempt, synthetic model
outputs on a simulated clock; `scripts/vllm_scheduler_replay.py` in vLLM's venv), once per
policy, the plugin loaded by `vllm.plugins.load_general_plugins()` from its entry point with
`VLLM_PLUGINS=lpc`. Two small workloads: a sample of the bundled Mooncake trace (the shipped
access model predicts in process) and synthetic ShareGPT-like chats (each request carries its
probability, a fifth carry none).

- `lpc-const`: every step schedules exactly what stock vLLM schedules (tokens per request,
  chunks, preemptions, prefix hits, the blocks allocated), with chunked prefills and
  preemptions actually happening;
- `lpc`, `lpc-pooled`: every request finishes and the pool ends whole: each block free, every
  reference count zero, the free queue holding each block once, every cached block in the
  hash map, block ownership consistent every step;
- `lpc-return` (the Mooncake sample, the shipped return-time model in process): the same
  invariants, each finished release carrying the model's curve, preempted requests protected;
- `shadow` (shadow mode): the engine schedules exactly as stock vLLM, every block it hands out
  is the one stock vLLM's `FreeKVCacheBlockQueue` (fed the same calls) hands out, and the
  shadow caches' hit tokens equal our replay of the same requests (`lpc.replay.shadow`);
- the kill switch: `lpc` switched to `lru` mid-run and back; in between every eviction is
  stock vLLM's, after it LPC's order is back.

Marked `vllm`: `pytest -m vllm tests/integrations/test_vllm_scheduler.py` after
`bash scripts/setup_vllm_plugin.sh`. The unmarked tests at the end need no vLLM.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from lpc.drivers.vllm_driver import REPO_ROOT
from lpc.drivers.vllm_scheduler import (
    EngineSettings,
    PluginSettings,
    first_divergence,
    parse_policies,
    policy_environment,
    token_runs,
)
from lpc.replay.probability import OracleSource
from lpc.traces.lpc_trace import write_trace
from lpc.workload import WorkloadConfig, open_loop_requests
from tests.integrations.report import REPORT
from tests.lpc.synthetic import conversations

SHIPPED_ACCESS_MODEL = REPO_ROOT / "models" / "mooncake-access"
SHIPPED_RETURN_MODEL = REPO_ROOT / "models" / "mooncake-return"
POLICIES = ("lru", "lpc-const=0.5", "lpc", "lpc-pooled", "shadow")
KILL_SWITCH = "300:lru,600:lpc"  # lpc evicts as stock vLLM from step 300 to step 599

# Each workload: its engine (a KV pool and a step time that make requests queue and preempt)
# and where the learned policies' p comes from.
WORKLOADS = {
    "mooncake": [
        *("--kv-tokens", "24000", "--block-size", "16", "--max-num-batched-tokens", "2048"),
        *("--max-num-seqs", "64", "--step-base-ms", "40", "--step-per-token-us", "10"),
        *("--access-model", str(SHIPPED_ACCESS_MODEL)),
    ],
    "sharegpt-like": [
        *("--kv-tokens", "3000", "--block-size", "16", "--max-num-batched-tokens", "256"),
        *("--max-num-seqs", "16", "--step-base-ms", "10", "--step-per-token-us", "100"),
    ],
}


def mooncake_sample(path: Path) -> int:
    """One conversation in 10 of the bundled Mooncake trace (scripts/sample_conversations.py's
    rule), arrivals in its first 15 minutes, requests cut at 16,384 tokens (so a pool of a
    few requests can hold the longest)."""
    from lpc.traces.load import TraceOptions, load_trace

    requests = [
        r
        for r in load_trace("mooncake", TraceOptions(max_model_len=16384)).requests
        if zlib.crc32(r.conversation_id.encode("utf-8")) % 10 == 0 and r.arrival_s < 900
    ]
    write_trace(path, requests, {"source": "bundled Mooncake, 1 conversation in 10, 15 min"})
    return len(requests)


def sharegpt_like(path: Path, conversations_count: int = 120, duration_s: float = 300) -> int:
    """Synthetic multi-turn chats whose next prompt repeats the previous output, with each
    request's oracle probability (a fifth missing: the fallback p)."""
    requests = open_loop_requests(
        conversations(conversations_count, seed=5),
        WorkloadConfig(
            mean_think_time_s=10, duration_s=duration_s, max_active_conversations=30, seed=3
        ),
    )
    rng = random.Random(1)
    oracle = OracleSource().predict([r.turn for r in requests])
    probabilities = [None if rng.random() < 0.2 else p for p in oracle]
    write_trace(path, requests, {"source": "synthetic chats"}, probabilities)
    return len(requests)


def run_scheduler_ab(
    trace: Path,
    vllm_python: Path,
    *args: str,
    policies: tuple[str, ...] = POLICIES,
    timeout_s: float = 1200,
    jobs: int = 2,
) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "scripts/vllm_scheduler_ab.py",
            str(trace),
            *("--policies", ",".join(policies), "--jobs", str(jobs), "--check-every", "1"),
            *("--vllm-python", str(vllm_python), "--json", *args),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def results(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("vllm-scheduler")
    out = {}
    for name, make in (("mooncake", mooncake_sample), ("sharegpt-like", sharegpt_like)):
        trace = folder / f"{name}.jsonl"
        count = make(trace)
        result = run_scheduler_ab(trace, vllm_python, *WORKLOADS[name])
        assert result["requests"] == count
        out[name] = result
    return out


@pytest.fixture(scope="module")
def kill_switch(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The synthetic chats under `lpc`, switched to `lru` at step 300 and back at step 600."""
    trace = tmp_path_factory.mktemp("vllm-kill-switch") / "sharegpt-like.jsonl"
    sharegpt_like(trace)
    return run_scheduler_ab(
        trace,
        vllm_python,
        *WORKLOADS["sharegpt-like"],
        *("--switch-at", KILL_SWITCH),
        policies=("lpc",),
    )


def rows_of(result: dict) -> dict[str, dict]:
    return {row["policy"]: row for row in result["rows"]}


@pytest.mark.vllm
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_lpc_const_schedules_exactly_as_stock_vllm(workload: str, results: dict) -> None:
    result = results[workload]
    rows = rows_of(result)
    lru, const = rows["lru"], rows["lpc-const=0.5"]
    parity = result["checks"]["lpc-const=0.5_equals_lru"]
    assert parity["equal"], parity["first_divergence"]
    assert parity["steps_compared"] == lru["steps"] > 0
    assert lru["chunked_prefills"] > 0, "no prompt was split over several steps"
    assert lru["preemptions"] > 0, "no request was preempted"
    assert lru["recomputed_tokens"] > 0
    for key in ("prefix_cache_hits", "preemptions", "recomputed_tokens", "chunked_prefills"):
        assert const[key] == lru[key], key
    assert lru["prefix_cache_hits"] > 0
    # A preemption is a protected release (last in the queue, LRU's place), not a release.
    assert const["releases"] == const["fallbacks_used"] == result["requests"]
    assert const["protected_releases"] == lru["preemptions"]
    vllm = result["vllm"]
    assert vllm["lru"]["scheduler"] == "vllm.v1.core.sched.scheduler.Scheduler"
    assert vllm["lru"]["queue"] == "FreeKVCacheBlockQueue"
    assert vllm["lru"]["environment"] == {"VLLM_PLUGINS": ""}
    assert vllm["lpc-const=0.5"]["queue"] == "LPCSchedulerQueue"
    assert vllm["lpc-const=0.5"]["environment"]["VLLM_PLUGINS"] == "lpc"
    assert vllm["lpc-const=0.5"]["additional_config"]["lpc"]["fallback_probability"] == 0.5
    REPORT.append(
        f"scheduler, {workload} ({result['requests']} requests): lpc-const == stock vLLM at all "
        f"{lru['steps']} steps; hit ratio {100 * lru['hit_ratio']:.3f}%, "
        f"{lru['preemptions']} preemptions, {lru['recomputed_tokens']} recomputed tokens, "
        f"{lru['chunked_prefills']} chunked prefills"
    )


@pytest.mark.vllm
@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("policy", ["lpc", "lpc-pooled"])
def test_learned_policies_keep_the_scheduler_invariants(
    workload: str, policy: str, results: dict
) -> None:
    result = results[workload]
    rows = rows_of(result)
    row = rows[policy]
    assert row["invariants_ok"], row["invariants"]
    assert all(row["invariants"].values())
    assert row["finished"] == row["requests"] == result["requests"]
    assert result["checks"]["invariants"][policy] is True
    assert result["vllm"][policy]["queue"] == "LPCSchedulerQueue"
    assert result["vllm"][policy]["additional_config"]["lpc"]["evictor"] == policy
    assert row["releases"] == result["requests"]
    assert row["protected_releases"] == row["preemptions"]
    # A preempted request's blocks go after every free block: it loses no more KV to eviction
    # while it waits than under LRU (the whole trace's check, on the samples).
    assert row["recomputed_evicted_tokens"] <= rows_of(result)["lru"]["recomputed_evicted_tokens"]
    if workload == "mooncake":
        assert row["predictions_in_process"] == row["releases"]
        assert row["fallbacks_used"] == 0
    else:
        assert row["probabilities_from_request"] > 0 and row["fallbacks_used"] > 0
    lru = rows["lru"]
    if policy == "lpc":
        assert (row["prefix_cache_hits"], row["evictions"]) != (
            lru["prefix_cache_hits"],
            lru["evictions"],
        ), "the learned p changed nothing"
    # lpc-pooled keys releases with the fallback p until its trust gate has judged 100
    # releases and found the model better than a constant (eviction/lpc_pooled.py): on a
    # sample this small it may evict as LRU does, which is its design, not a fault.
    REPORT.append(
        f"scheduler, {workload}, {policy}: invariants hold; hit ratio "
        f"{100 * row['hit_ratio']:.3f}% (lru {100 * lru['hit_ratio']:.3f}%), "
        f"{row['preemptions']} preemptions, {row['recomputed_tokens']} recomputed tokens"
    )


@pytest.mark.vllm
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_shadow_mode_is_stock_vllm_and_its_figures_equal_our_replay(
    workload: str, results: dict
) -> None:
    result = results[workload]
    rows = rows_of(result)
    lru, shadow = rows["lru"], rows["shadow"]
    parity = result["checks"]["shadow_equals_lru"]
    assert parity["equal"], parity["first_divergence"]
    assert parity["steps_compared"] == lru["steps"] > 0
    order = result["checks"]["lru_order"]["shadow"]
    assert order["lru_mismatches"] == 0 and order["lru_pops"] > 0 and order["lpc_pops"] == 0
    replay = result["checks"]["shadow_equals_replay"]
    assert replay["equal"], replay["shadow_vs_replay"]
    assert shadow["shadow_requests"] == result["requests"]
    assert shadow["shadow_queries"] == result["prompt_tokens"]
    assert shadow["shadow_errors"] == shadow["shadow_overflows"] == 0
    assert shadow["shadow_lpc_hit_ratio"] == replay["replay_lpc_hit_ratio"]
    assert shadow["shadow_lru_hit_ratio"] == replay["replay_lru_hit_ratio"]
    assert shadow["shadow_lpc_hits"] != shadow["shadow_lru_hits"], "the p changed nothing"
    assert result["vllm"]["shadow"]["additional_config"]["lpc"]["mode"] == "shadow"
    REPORT.append(
        f"scheduler, {workload}, shadow: stock vLLM at all {lru['steps']} steps; "
        f"{order['lru_pops']} blocks handed out as vLLM's own queue does; shadow hit ratio "
        f"lpc {100 * shadow['shadow_lpc_hit_ratio']:.3f}%, lru "
        f"{100 * shadow['shadow_lru_hit_ratio']:.3f}% (= our replay; the engine's "
        f"{100 * lru['hit_ratio']:.3f}%)"
    )


@pytest.mark.vllm
def test_lpc_return_keeps_the_scheduler_invariants_on_the_mooncake_sample(
    vllm_python: Path, tmp_path: Path
) -> None:
    """`lpc-return` inside vLLM's scheduler: every request finishes, the pool ends whole, every
    finished release's curve comes from the return-time model (the access model runs beside
    it and shares its conversation table), preemptions go through its protected claims, and
    the curves change what is evicted."""
    trace = tmp_path / "mooncake.jsonl"
    count = mooncake_sample(trace)
    result = run_scheduler_ab(
        trace,
        vllm_python,
        *WORKLOADS["mooncake"],
        *("--return-model", str(SHIPPED_RETURN_MODEL)),
        policies=("lru", "lpc-return"),
    )
    assert result["requests"] == count and result["ok"], result["checks"]
    rows = rows_of(result)
    row, lru = rows["lpc-return"], rows["lru"]
    assert row["invariants_ok"] and all(row["invariants"].values()), row["invariants"]
    assert row["finished"] == row["requests"] == count
    assert result["vllm"]["lpc-return"]["queue"] == "LPCSchedulerQueue"
    table = result["vllm"]["lpc-return"]["additional_config"]["lpc"]
    assert table["evictor"] == "lpc-return"
    assert table["return_model"] == str(SHIPPED_RETURN_MODEL.resolve())
    assert row["releases"] == row["return_curves_in_process"] == count
    assert row["return_curve_errors"] == row["invalid_return_curves"] == 0
    assert row["plugin_errors"] == 0
    assert row["protected_releases"] == row["preemptions"] > 0
    assert row["return_window_seconds"] > 0
    assert (row["prefix_cache_hits"], row["evictions"]) != (
        lru["prefix_cache_hits"],
        lru["evictions"],
    ), "the curves changed nothing"
    REPORT.append(
        f"scheduler, mooncake, lpc-return: invariants hold; hit ratio "
        f"{100 * row['hit_ratio']:.3f}% (lru {100 * lru['hit_ratio']:.3f}%), "
        f"{row['preemptions']} preemptions, W {row['return_window_seconds']:.1f} s at the end"
    )


@pytest.mark.vllm
def test_one_data_parallel_rank_schedules_as_stock_vllm(vllm_python: Path, tmp_path: Path) -> None:
    """Data parallelism, verified: each rank's engine core builds its own scheduler and KV
    cache, so the plugin runs in each unchanged. Rank 1 of a 2-rank engine, serving its share
    of the requests, schedules with `lpc-const` exactly as stock vLLM, and `lpc-pooled` keeps
    every invariant there."""
    trace = tmp_path / "sharegpt-like.jsonl"
    count = sharegpt_like(trace)
    result = run_scheduler_ab(
        trace,
        vllm_python,
        *WORKLOADS["sharegpt-like"],
        "--data-parallel",
        "2:1",
        policies=("lru", "lpc-const=0.5", "lpc-pooled"),
    )
    assert result["requests"] == count and result["ok"]
    assert all(v["data_parallel"] == [2, 1] for v in result["vllm"].values())
    parity = result["checks"]["lpc-const=0.5_equals_lru"]
    assert parity["equal"], parity["first_divergence"]
    rows = rows_of(result)
    assert rows["lru"]["preemptions"] > 0 and rows["lru"]["chunked_prefills"] > 0
    assert rows["lpc-pooled"]["invariants_ok"]
    REPORT.append(
        f"scheduler, data-parallel rank 1 of 2: lpc-const == stock vLLM at all "
        f"{rows['lru']['steps']} steps; lpc-pooled invariants hold"
    )


@pytest.mark.vllm
def test_the_kill_switch_evicts_as_stock_vllm_until_switched_back(kill_switch: dict) -> None:
    row = rows_of(kill_switch)["lpc"]
    assert row["mode_switches"] == [[300, "lru"], [600, "lpc"]]
    assert row["invariants_ok"] and row["finished"] == kill_switch["requests"]
    order = kill_switch["checks"]["lru_order"]["lpc"]
    assert order["lru_pops"] > 0 and order["lru_mismatches"] == 0
    assert order["lpc_not_lru"] > 0, "LPC's order never came back (or never differed)"
    assert kill_switch["ok"]
    REPORT.append(
        f"scheduler, kill switch ({KILL_SWITCH}): {order['lru_pops']} blocks handed out in "
        f"LRU mode, all as stock vLLM's queue; {order['lpc_not_lru']} of {order['lpc_pops']} "
        "in LPC mode unlike LRU"
    )


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.engine_trace
def test_the_whole_mooncake_trace_through_vllm_scheduler(vllm_python: Path) -> None:
    """The whole bundled Mooncake hour (12,031 requests) through vLLM's scheduler, with the
    settings of docs/serving.md: `lpc-const` equals stock vLLM at every step, chunked prefills
    and preemptions included; every policy keeps the invariants; and with `lpc-pooled` the
    preempted requests lose no more KV to eviction than with LRU (their blocks go last).
    A documented command (`engine_trace`), not CI: the Mooncake sample above runs the same
    checks (every step compared, invariants checked at every step)."""
    result = run_scheduler_ab(
        Path("mooncake"),
        vllm_python,
        *("--kv-tokens", "400000", "--block-size", "512", "--max-num-batched-tokens", "8192"),
        *("--max-num-seqs", "128", "--access-model", str(SHIPPED_ACCESS_MODEL)),
        *("--check-every", "0"),
        policies=("lru", "lpc-const=0.5", "lpc-pooled"),
        timeout_s=3000,
    )
    assert result["requests"] == 12031 and result["ok"], result["checks"]
    parity = result["checks"]["lpc-const=0.5_equals_lru"]
    assert parity["equal"], parity["first_divergence"]
    rows = rows_of(result)
    lru, pooled = rows["lru"], rows["lpc-pooled"]
    assert parity["steps_compared"] == lru["steps"]
    assert lru["preemptions"] > 0 and lru["chunked_prefills"] > 0
    assert pooled["protected_releases"] == pooled["preemptions"]
    # No preempted request lost KV to eviction while it waited: every full block it had
    # computed was found again (what it recomputes is its last, partial block, never cached,
    # and so depends on when the schedule preempted it, not on the policy).
    assert pooled["recomputed_evicted_tokens"] <= lru["recomputed_evicted_tokens"]
    REPORT.append(
        f"scheduler, whole Mooncake trace: lpc-const == stock vLLM at all {lru['steps']} steps "
        f"({lru['preemptions']} preemptions, {lru['chunked_prefills']} chunked prefills); hit "
        f"ratio lru {100 * lru['hit_ratio']:.4f}%, lpc-pooled {100 * pooled['hit_ratio']:.4f}%; "
        f"recomputed tokens lru {lru['recomputed_tokens']} ({lru['recomputed_evicted_tokens']} "
        f"evicted), lpc-pooled {pooled['recomputed_tokens']} "
        f"({pooled['recomputed_evicted_tokens']} evicted)"
    )


# -- no vLLM needed -----------------------------------------------------------------------------
def test_token_runs_round_trip() -> None:
    tokens = [5, 6, 7, 3, 9, 10, 0]
    runs = token_runs(tokens)
    assert runs == [5, 3, 3, 1, 9, 2, 0, 1]
    expanded = [t for s, n in zip(runs[::2], runs[1::2], strict=True) for t in range(s, s + n)]
    assert expanded == tokens
    assert token_runs([]) == []


def test_policies_parse_and_refuse() -> None:
    assert [
        p.label
        for p in parse_policies("lru,lpc-const,lpc-const=0.7,lpc,lpc-pooled,lpc-return,shadow")
    ] == ["lru", "lpc-const=0.5", "lpc-const=0.7", "lpc", "lpc-pooled", "lpc-return", "shadow"]
    with pytest.raises(ValueError, match="unknown policy"):
        parse_policies("lfu")
    with pytest.raises(ValueError, match="takes no value"):
        parse_policies("lpc=0.3")
    assert EngineSettings(kv_tokens=3000, block_size=16).num_blocks == 188


def test_lpc_return_is_configured_with_its_return_model() -> None:
    policy = parse_policies("lpc-return")[0]
    with pytest.raises(ValueError, match="--return-model"):
        policy_environment(policy, PluginSettings())
    settings = PluginSettings(access_model=SHIPPED_ACCESS_MODEL, return_model=SHIPPED_RETURN_MODEL)
    env, send_probabilities = policy_environment(policy, settings)
    assert (env["LPC_EVICTOR"], env["LPC_RETURN_MODEL"]) == (
        "lpc-return",
        str(SHIPPED_RETURN_MODEL.resolve()),
    )
    assert env["LPC_ACCESS_MODEL"] == str(SHIPPED_ACCESS_MODEL.resolve()) and not send_probabilities


def test_first_divergence_names_the_step_and_field(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"step":1,"scheduled":[["r",4]]}\n{"step":2,"scheduled":[["r",1]]}\n')
    b.write_text('{"step":1,"scheduled":[["r",4]]}\n{"step":2,"scheduled":[["r",2]]}\n')
    assert first_divergence(a, a) is None
    assert first_divergence(a, b) == ("step 2: scheduled differs: [['r', 1]] vs [['r', 2]]")
    b.write_text('{"step":1,"scheduled":[["r",4]]}\n')
    assert first_divergence(a, b) == "2 steps vs 1 steps"
