"""Serving a trace with vLLM 0.33.0's own `Scheduler`, one driver process per policy.

`scripts/vllm_scheduler_replay.py` runs in vLLM's venv (`vllm_driver.vllm_python_path()`);
this module, in the project's venv, writes the requests it serves, sets each policy's
environment (vLLM loads the plugin from its `vllm.general_plugins` entry point with
`VLLM_PLUGINS=lpc`, and the plugin reads the LPC_* variables, as in a deployment), runs it
and reads back its summary and per-step records. `lpc vllm-ab` (`lpc.cli.vllm_ab`) is the
command; `tests/integrations/test_vllm_scheduler.py` the tests.

Policies: `lru` is stock vLLM (`VLLM_PLUGINS=` empty: no plugin); `installed` the plugin
installed but not configured (`VLLM_PLUGINS` unset, so vLLM loads it, and no LPC setting: it
must leave vLLM stock); `floor` stock vLLM with the floor queue in its block pool
(`lpc.benchmarks.floor_queue`: a queue keyed once per release and nothing else, which evicts
in vLLM's own LRU order: what any such queue costs at this seam); `lpc-const[=P]` the plugin
with one p for every release (its fallback p; no request carries one); `lpc` and `lpc-pooled`
the plugin's two LPC evictors (`LPC_EVICTOR`) with p from an access-only model run in
process (`LPC_ACCESS_MODEL`) or, without one, each request's `probability` from the trace
(sent as `lpc_probability`, as an API layer would; a missing one gets the fallback p);
`lpc-return` the return-time evictor, each release's curve from the return-time model run in
process (`LPC_RETURN_MODEL`, which it needs; the access model runs beside it when given).
`shadow` and `shadow-pooled` run the plugin in shadow mode (`LPC_MODE=shadow`): the engine
evicts as stock vLLM, while metadata-only caches with `lpc` (or `lpc-pooled`) and LRU replay
the same requests with the same p as the learned policies; their event log is written beside
the records (`shadow_events_path`). `switch_at` switches the learned policies' mode
mid-run (the kill switch).

The plugin's policies reach vLLM through vLLM's own `--scheduler-cls` naming `LPCScheduler`,
their settings as the `lpc` table of `--additional-config` (no LPC_* variable set), or, with
`eviction_policy` (a vLLM with the seam of docs/vllm-eviction-seam.patch), through the seam,
their settings the LPC_* variables. `lru` and `installed` are stock either way.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from eviction.lpc_pooled import DEFAULT_MEMORY
from lpc.drivers.release_plan import PluginSettings
from lpc.drivers.vllm_driver import REPO_ROOT
from lpc.replay.shadow import ShadowRequest, learned_evictor_factory, read_events, replay_shadow
from lpc.workload import WorkloadRequest

DRIVER = REPO_ROOT / "scripts" / "vllm_scheduler_replay.py"
ENTRY_POINT_GROUP = "vllm.general_plugins"
TIMEOUT_S = 3600
LEARNED = ("lpc", "lpc-pooled", "lpc-return")
STOCK = ("lru", "installed", "floor")  # no LPC in vLLM (`floor`: the floor queue in its pool)
FLOOR_QUEUE = "RunFloorQueue"
SHADOW = {"shadow": "lpc", "shadow-pooled": "lpc-pooled"}  # policy -> the shadow's evictor
# The plugin's path into vLLM (`PolicyRun.through`).
SCHEDULER_CLASS_PATH = "scheduler-class"
SEAM_PATH = "seam"
SCHEDULER_CLASS = "lpc.integrations.vllm_scheduler_class.LPCScheduler"


class SchedulerRunFailed(RuntimeError):
    """The scheduler driver exited with an error."""


@dataclass(frozen=True)
class EngineSettings:
    """The simulated engine: vLLM's scheduler limits, the KV pool and the step-time model."""

    kv_tokens: int
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    step_base_s: float = 0.010
    step_per_token_s: float = 1e-5
    max_model_len: int | None = None  # None: the longest request's tokens, rounded up
    check_every: int = 0  # check block ownership every N steps (0: at the end only)
    # The scheduler of one rank of a data-parallel engine (size 1: no data parallelism).
    data_parallel_size: int = 1
    data_parallel_rank: int = 0

    @property
    def num_blocks(self) -> int:
        """Blocks of the pool, vLLM's null block included."""
        if self.kv_tokens < self.block_size:
            raise ValueError(f"{self.kv_tokens} tokens hold no {self.block_size}-token block")
        return self.kv_tokens // self.block_size + 1


@dataclass(frozen=True)
class Policy:
    name: str  # lru, installed, floor, lpc-const, lpc, lpc-pooled, lpc-return, shadow, ...
    constant: float | None = None  # lpc-const's p

    @property
    def label(self) -> str:
        return self.name if self.constant is None else f"{self.name}={self.constant:g}"


def parse_policies(text: str) -> list[Policy]:
    """`lru,installed,floor,lpc-const,lpc,lpc-pooled,lpc-return,shadow,shadow-pooled`;
    `lpc-const=P` sets the constant (default 0.5)."""
    policies = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, value = item.partition("=")
        if name not in (*STOCK, "lpc-const", *LEARNED, *SHADOW):
            raise ValueError(
                f"unknown policy {item!r}: choose lru, installed, floor, lpc-const[=P], lpc, "
                "lpc-pooled, lpc-return, shadow, shadow-pooled"
            )
        if value and name != "lpc-const":
            raise ValueError(f"policy {name} takes no value")
        constant = None
        if name == "lpc-const":
            constant = float(value) if value else 0.5
            if not 0 < constant < 1:
                raise ValueError(f"lpc-const's p must be in (0, 1), got {constant}")
        policies.append(Policy(name, constant))
    if not policies:
        raise ValueError("no policy given")
    return policies


def token_runs(tokens: Sequence[int]) -> list[int]:
    """Token ids as runs of consecutive ids, flattened `[start, length, start, length, ...]`."""
    values = np.asarray(tokens[:] if not isinstance(tokens, list) else tokens, dtype=np.int64)
    if len(values) == 0:
        return []
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [len(values)])))
    out = np.empty(2 * len(starts), dtype=np.int64)
    out[0::2] = values[starts]
    out[1::2] = lengths
    return out.tolist()


@dataclass
class RequestsFile:
    path: Path
    requests: int
    prompt_tokens: int
    output_tokens: int
    longest_tokens: int  # prompt + output of the longest request
    with_probability: int


def write_requests(
    path: Path,
    requests: Sequence[WorkloadRequest],
    probabilities: Sequence[float | None] | None = None,
) -> RequestsFile:
    """The driver's input: requests in arrival order, token ids as runs."""
    if probabilities is not None and len(probabilities) != len(requests):
        raise ValueError(f"{len(probabilities)} probabilities for {len(requests)} requests")
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    prompt_total = output_total = longest = with_p = 0
    with path.open("w", encoding="utf-8") as sink:
        for i in order:
            request = requests[i]
            turn = request.turn
            if turn.lora_id is not None:
                raise ValueError(
                    f"request {request.request_id} uses LoRA {turn.lora_id!r}; the scheduler "
                    "replay loads no adapters"
                )
            tokens = turn.token_ids
            n_prompt = turn.num_prompt_tokens
            n_output = len(tokens) - n_prompt
            probability = probabilities[i] if probabilities is not None else None
            with_p += probability is not None
            line = {
                "request_id": request.request_id,
                "conversation_id": request.conversation_id,
                "arrival_s": request.arrival_s,
                "prompt": token_runs(tokens[:n_prompt]),
                "output": token_runs(tokens[n_prompt:]),
                "probability": probability,
                "cache_salt": turn.cache_salt,
            }
            sink.write(json.dumps(line, separators=(",", ":")) + "\n")
            prompt_total += n_prompt
            output_total += n_output
            longest = max(longest, n_prompt + max(1, n_output))
    return RequestsFile(path, len(requests), prompt_total, output_total, longest, with_p)


def entry_point_site(folder: Path) -> Path:
    """A throwaway distribution declaring the pyproject's `lpc` entry point of vLLM's plugin
    group, so vLLM's own loader finds the plugin without installing anything in its venv."""
    import tomllib

    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    value = pyproject["project"]["entry-points"][ENTRY_POINT_GROUP]["lpc"]
    dist = folder / "lpc_scheduler_replay_entry_point-0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: lpc-scheduler-replay-entry-point\nVersion: 0.0\n",
        encoding="utf-8",
    )
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nlpc = {value}\n", encoding="utf-8"
    )
    return folder


def policy_environment(policy: Policy, settings: PluginSettings) -> tuple[dict[str, str], bool]:
    """The variables vLLM and the plugin read for `policy`, and whether requests carry the
    trace's probabilities."""
    if policy.name in ("lru", "floor"):
        return {"VLLM_PLUGINS": ""}, False
    if policy.name == "installed":  # vLLM loads every installed plugin; LPC is not configured
        return {}, False
    env = {
        "VLLM_PLUGINS": "lpc",
        "LPC_SCALE": repr(settings.scale_per_s),
        "LPC_STATS_LOG_INTERVAL_S": "0",
    }
    if policy.name == "lpc-const":
        assert policy.constant is not None
        return {**env, "LPC_EVICTOR": "lpc", "LPC_FALLBACK_P": repr(policy.constant)}, False
    if policy.name in SHADOW:
        env["LPC_MODE"] = "shadow"
    env["LPC_EVICTOR"] = SHADOW.get(policy.name, policy.name)
    env["LPC_FALLBACK_P"] = repr(settings.fallback_probability)
    if settings.conversation_table_max_tokens is not None:
        env["LPC_CONVERSATION_TABLE_MAX_TOKENS"] = str(settings.conversation_table_max_tokens)
    if settings.pooled_memory != DEFAULT_MEMORY:  # the default's settings stay as they were
        env["LPC_POOLED_MEMORY"] = settings.pooled_memory
    if policy.name == "lpc-return":
        if settings.return_model is None:
            raise ValueError("lpc-return needs a return-time model (--return-model DIR)")
        env["LPC_RETURN_MODEL"] = str(Path(settings.return_model).resolve())
        env["LPC_RETURN_MODEL_RELOAD_S"] = "0"
    if settings.access_model is None:
        # The trace's p ride in the requests as a trusted API layer sets them (`trust`).
        return {**env, "LPC_TRUST_REQUEST_HINTS": "1"}, True
    env["LPC_ACCESS_MODEL"] = str(Path(settings.access_model).resolve())
    env["LPC_ACCESS_MODEL_RELOAD_S"] = "0"
    return env, False


def additional_config_table(variables: dict[str, str]) -> dict[str, Any]:
    """The `lpc` table of `--additional-config` holding the settings the LPC_* `variables`
    give (typed and checked as the plugin reads them), one key per variable set."""
    from lpc.integrations.config import ENVIRONMENT_VARIABLES, load_config

    config = load_config(variables).as_dict()
    return {
        name: config[name]
        for variable, name in ENVIRONMENT_VARIABLES.items()
        if variable in variables
    }


def scheduler_class_environment(
    variables: dict[str, str],
) -> tuple[dict[str, str], dict[str, Any]]:
    """A plugin policy's environment for the scheduler class: its LPC_* settings moved to the
    `--additional-config` table; the plugin stays loaded by vLLM, and unconfigured."""
    table = additional_config_table({k: v for k, v in variables.items() if k.startswith("LPC_")})
    rest = {k: v for k, v in variables.items() if not k.startswith("LPC_")}
    return rest, {"lpc": table}


@dataclass
class PolicyRun:
    policy: Policy
    summary: dict[str, Any]
    records: Path | None
    wall_seconds: float
    environment: dict[str, str] = field(default_factory=dict)

    shadow_events: Path | None = None
    through: str | None = None  # the plugin's path into vLLM; None: stock vLLM
    additional_config: dict[str, Any] | None = None

    @property
    def totals(self) -> dict[str, Any]:
        return self.summary["totals"]

    @property
    def hit_ratio(self) -> float:
        queries = self.totals["prefix_cache_queries"]
        return self.totals["prefix_cache_hits"] / queries if queries else 0.0


def max_model_len_for(requests: RequestsFile, engine: EngineSettings) -> int:
    if engine.max_model_len is not None:
        return engine.max_model_len
    block = engine.block_size
    return -(-(requests.longest_tokens + 1) // block) * block


def run_policy(
    python: Path,
    requests: RequestsFile,
    policy: Policy,
    engine: EngineSettings,
    settings: PluginSettings,
    workdir: Path,
    records: bool = True,
    timeout_s: float = TIMEOUT_S,
    switch_at: str = "",
    eviction_policy: str | None = None,
    time_steps: bool = False,
    interleave: bool = False,
) -> PolicyRun:
    """Serve `requests` with vLLM's scheduler under `policy`, in a fresh driver process;
    `switch_at` (`STEP:MODE,...`) switches the plugin's mode before those steps;
    `eviction_policy` sets vLLM's `CacheConfig.eviction_policy` (a vLLM with the seam of
    docs/vllm-eviction-seam.patch: the plugin goes through the seam, else through the
    scheduler class); `time_steps` times the scheduler thread's CPU per step; `interleave`
    builds stock vLLM's `Scheduler` in the same process and steps the two in turn, each step
    timed (`lpc.drivers.step_interleave`: the scheduler class, or `floor`)."""
    expected = policy.name not in STOCK
    floor = policy.name == "floor"
    path = (
        (SEAM_PATH if eviction_policy is not None else SCHEDULER_CLASS_PATH) if expected else None
    )
    if floor and eviction_policy is not None:
        raise ValueError("floor is stock vLLM with the floor queue: it takes no eviction policy")
    if interleave and path != SCHEDULER_CLASS_PATH and not floor:
        raise ValueError(
            "interleaving pairs a plugin policy through the scheduler class with stock vLLM in "
            f"one process; not {policy.label}" + (" through the seam" if path else "")
        )
    max_model_len = max_model_len_for(requests, engine)
    if engine.kv_tokens < max_model_len:
        raise ValueError(
            f"a KV pool of {engine.kv_tokens} tokens cannot hold the longest request "
            f"({requests.longest_tokens} tokens, max_model_len {max_model_len}): vLLM would "
            "never schedule it"
        )
    slug = policy.label.replace("=", "-")
    site = entry_point_site(workdir / "entry-point")
    summary_path = workdir / f"{slug}.summary.json"
    records_path = workdir / f"{slug}.records.jsonl" if records else None
    variables, send_probabilities = policy_environment(policy, settings)
    table = None
    if path == SCHEDULER_CLASS_PATH:
        variables, table = scheduler_class_environment(variables)
    command = [
        str(python),
        str(DRIVER),
        *("--requests", str(requests.path), "--summary", str(summary_path)),
        *("--block-size", str(engine.block_size), "--num-blocks", str(engine.num_blocks)),
        *("--max-num-batched-tokens", str(engine.max_num_batched_tokens)),
        *("--max-num-seqs", str(engine.max_num_seqs), "--max-model-len", str(max_model_len)),
        *("--step-base-s", repr(engine.step_base_s)),
        *("--step-per-token-s", repr(engine.step_per_token_s)),
        *("--check-every", str(engine.check_every), "--label", policy.label),
        *("--data-parallel-size", str(engine.data_parallel_size)),
        *("--data-parallel-rank", str(engine.data_parallel_rank)),
    ]
    if records_path is not None:
        command += ["--records", str(records_path)]
    if send_probabilities:
        command.append("--send-probabilities")
    if switch_at:
        command += ["--switch-at", switch_at]
    if eviction_policy is not None:
        command += ["--eviction-policy", eviction_policy]
    if time_steps:
        command.append("--time-steps")
    if interleave:
        command.append("--interleave")
    if floor:
        command.append("--floor-queue")
    if table is not None:
        command += ["--scheduler-cls", SCHEDULER_CLASS, "--additional-config", json.dumps(table)]
    shadow_path = workdir / f"{slug}.shadow.jsonl" if policy.name in SHADOW else None
    if shadow_path is not None:
        command += ["--shadow-events", str(shadow_path)]
    # A developer's shell cannot change what is measured: its LPC_* and VLLM_* are dropped.
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("LPC_", "VLLM_"))}
    environment["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(site)])
    environment.update(variables)
    started = time.perf_counter()
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
        env=environment,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0 or not summary_path.exists():
        tail = "\n".join(done.stderr.strip().splitlines()[-25:])
        raise SchedulerRunFailed(
            f"the vLLM scheduler driver failed for {policy.label} (exit {done.returncode}):\n{tail}"
        )
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    if interleave and "interleaved" not in summary:
        raise SchedulerRunFailed(f"{policy.label}: the driver ran no stock engine beside it")
    if table is not None and summary["scheduler"] != SCHEDULER_CLASS:
        raise SchedulerRunFailed(
            f"{policy.label}: vLLM ran {summary['scheduler']}, not {SCHEDULER_CLASS}"
        )
    if policy.name == "installed" and not summary["plugins"].get("lpc_imported"):
        raise SchedulerRunFailed(
            f"installed: vLLM did not load the LPC plugin (plugins {summary['plugins']})"
        )
    if bool(summary["plugins"].get("lpc")) != expected:
        raise SchedulerRunFailed(
            f"{policy.label}: the LPC plugin was {'not ' if expected else ''}loaded by vLLM "
            f"(plugins {summary['plugins']})"
        )
    queue = summary["invariants"]["queue"]
    switches = summary.get("mode_switches") or []
    # Switched off (lru) and drained, the plugin hands the pool vLLM's own queue: either is
    # right then.
    ended_off = bool(switches) and switches[-1][1] == "lru"
    if floor:
        if queue != FLOOR_QUEUE:
            raise SchedulerRunFailed(f"floor: vLLM's block pool used the queue {queue}")
    elif (queue == "FreeKVCacheBlockQueue") == expected and not ended_off:
        raise SchedulerRunFailed(f"{policy.label}: vLLM's block pool used the queue {queue}")
    return PolicyRun(policy, summary, records_path, wall, variables, shadow_path, path, table)


def _lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as lines:
        yield from lines


def first_divergence(a: Path, b: Path, fields: Iterable[str] | None = None) -> str | None:
    """The first step whose record differs between two runs (None: every step is equal).

    `fields` limits the comparison (default: every field of the record)."""
    keys = tuple(fields) if fields is not None else None
    step = 0
    for step, (left, right) in enumerate(zip(_lines(a), _lines(b), strict=False), 1):
        if left == right:
            continue
        x, y = json.loads(left), json.loads(right)
        names = keys if keys is not None else sorted(set(x) | set(y))
        for name in names:
            if x.get(name) != y.get(name):
                return f"step {step}: {name} differs: {x.get(name)!r} vs {y.get(name)!r}"
    count_a = sum(1 for _ in _lines(a))
    count_b = sum(1 for _ in _lines(b))
    if count_a != count_b:
        return f"{count_a} steps vs {count_b} steps"
    return None


def policy_row(run: PolicyRun) -> dict[str, Any]:
    """The figures reported per policy."""
    totals = run.totals
    stats = run.summary.get("plugin_stats", {})
    return {
        "policy": run.policy.label,
        "hit_ratio": run.hit_ratio,
        "prefix_cache_hits": totals["prefix_cache_hits"],
        "prefix_cache_queries": totals["prefix_cache_queries"],
        "preempted_prefix_cache_hits": totals["preempted_prefix_cache_hits"],
        "preempted_prefix_cache_queries": totals["preempted_prefix_cache_queries"],
        "steps": totals["steps"],
        "preemptions": totals["preemptions"],
        "recomputed_tokens": totals["recomputed_tokens"],
        "recomputed_evicted_tokens": totals["recomputed_evicted_tokens"],
        "chunked_prefills": totals["chunked_prefills"],
        "chunked_recomputations": totals["chunked_recomputations"],
        "evictions": totals["evictions"],
        "scheduled_tokens": totals["scheduled_tokens"],
        "finished": totals["finished"],
        "requests": totals["requests"],
        "max_running": totals["max_running"],
        "max_waiting": totals["max_waiting"],
        "simulated_seconds": run.summary["simulated_seconds"],
        "invariants_ok": run.summary["invariants"]["ok"],
        "scheduler_cpu": run.summary.get("scheduler_cpu"),
        "interleaved": run.summary.get("interleaved"),
        "invariants": run.summary["invariants"]["checks"],
        "releases": stats.get("releases"),
        "protected_releases": stats.get("preemptions"),
        "protected_blocks_released": stats.get("protected_blocks_released"),
        "predictions_in_process": stats.get("predictions_in_process"),
        "in_process_scoring_calls": stats.get("in_process_scoring_calls"),
        "return_curves_in_process": stats.get("return_curves_in_process"),
        "return_curve_errors": stats.get("return_curve_errors"),
        "invalid_return_curves": stats.get("invalid_return_curves"),
        "return_window_seconds": stats.get("return_window_seconds"),
        "plugin_errors": stats.get("plugin_errors"),
        "plugin_timers": plugin_timers(stats),
        "probabilities_from_request": stats.get("probabilities_from_request"),
        "fallbacks_used": stats.get("fallbacks_used"),
        "mode_switches": run.summary.get("mode_switches"),
        "lru_order_check": run.summary.get("lru_order_check"),
        **{key: value for key, value in stats.items() if key.startswith("shadow_")},
        "driver_seconds": run.summary["run_seconds"],
        "wall_seconds": round(run.wall_seconds, 2),
    }


# The plugin's timers on the scheduler thread (its latency histograms), as reported per policy.
PLUGIN_TIMERS = ("scoring_seconds", "free_seconds", "release_seconds")


def plugin_timers(stats: dict[str, Any]) -> dict[str, dict[str, float]] | None:
    """Each timer's sum (s) and count from the plugin's histograms; None without them."""
    histograms = stats.get("histograms")
    if not histograms:
        return None
    return {
        name: {"total_s": histograms[name]["total"], "count": histograms[name]["count"]}
        for name in PLUGIN_TIMERS
        if name in histograms
    }


def expand_runs(runs: Sequence[int]) -> list[int]:
    """`token_runs`' inverse."""
    tokens: list[int] = []
    for i in range(0, len(runs), 2):
        tokens.extend(range(runs[i], runs[i] + runs[i + 1]))
    return tokens


def shadow_requests(path: Path) -> dict[str, ShadowRequest]:
    """The requests of a requests file as the engine holds them: the prompt, then the output
    it emits (one token when the line has none, as the driver serves it)."""
    out = {}
    for line in _lines(path):
        record = json.loads(line)
        prompt = expand_runs(record["prompt"])
        output = expand_runs(record["output"]) or [0]
        out[record["request_id"]] = ShadowRequest(
            prompt + output, len(prompt), record["cache_salt"]
        )
    return out


def shadow_replay_check(run: PolicyRun, requests_path: Path) -> dict[str, Any]:
    """The run's shadow figures beside our replay of the same events (`lpc.replay.shadow`):
    the same requests in the same order, with the same times and probabilities, hashed by us."""
    assert run.shadow_events is not None, f"{run.policy.label} ran no shadow"
    stats = run.summary["plugin_stats"]
    config = stats["config"]
    factory = learned_evictor_factory(
        config["evictor"],
        config["scale_per_s"],
        config["fallback_probability"],
        config["probability_floor"],
        stats["evictor_horizon_s"],
        config.get("pooled_memory", DEFAULT_MEMORY),
    )
    ours = replay_shadow(shadow_requests(requests_path), read_events(run.shadow_events), factory)
    pairs = {
        "requests": (stats["shadow_requests"], ours.requests),
        "queries": (stats["shadow_queries"], ours.queries),
        **{f"{c}_hits": (stats[f"shadow_{c}_hits"], ours.hits[c]) for c in ("lpc", "lru")},
        **{
            f"{c}_allocation_failures": (
                stats[f"shadow_{c}_allocation_failures"],
                ours.allocation_failures[c],
            )
            for c in ("lpc", "lru")
        },
    }
    return {
        "equal": all(shadow == replay for shadow, replay in pairs.values()),
        "shadow_vs_replay": {key: list(pair) for key, pair in pairs.items()},
        "replay_lpc_hit_ratio": ours.hit_ratio("lpc"),
        "replay_lru_hit_ratio": ours.hit_ratio("lru"),
    }


def settings_dict(engine: EngineSettings, settings: PluginSettings) -> dict[str, Any]:
    out = {**asdict(engine), **asdict(settings), "num_blocks": engine.num_blocks}
    for name in ("access_model", "return_model"):
        if out[name] is not None:
            out[name] = str(out[name])
    return out
