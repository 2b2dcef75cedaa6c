"""`lpc vllm-ab`: serve a request trace with vLLM 0.33.0's own scheduler, stock and with LPC."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eviction.lpc_pooled import DEFAULT_MEMORY, MEMORIES
from lpc.errors import CommandError

DESCRIPTION = """\
Runs in the project's venv and drives vLLM's venv (scripts/setup_vllm_plugin.sh) through
scripts/vllm_scheduler_replay.py, one process per policy: vLLM's `Scheduler` on the CPU with
chunked prefill, a token budget, a KV pool and a step-time model, fed synthetic model outputs
(the trace's output tokens) on a simulated clock; requests arrive on the trace's timeline.

    lpc vllm-ab mooncake --kv-tokens 400000 --block-size 512 --max-num-batched-tokens 8192 \\
        --max-num-seqs 128 --access-model models/mooncake-access

TRACE is a JSONL file as `lpc ab --export-trace` writes it (any format `lpc ab --trace`
reads) or a bundled trace (`mooncake`, `mooncake-synthetic`). Policies: `lru` (stock vLLM),
`floor` (stock vLLM with a queue keyed once per release and nothing else, in vLLM's own LRU
order: the least such a queue costs; `lpc.benchmarks.floor_queue`), `lpc-const[=P]` (the
plugin, one p for every release), `lpc` and `lpc-pooled` (the plugin's learned evictors: p
from `--access-model` in process, else each line's `probability`, sent as the request's
`lpc_probability`; a line without one gets the fallback p), `lpc-return`
(the return-time evictor: each release's curve from `--return-model` in process), `shadow` and
`shadow-pooled` (the plugin in shadow mode: stock vLLM's eviction, while metadata-only `lpc`
or `lpc-pooled` and LRU caches replay the same requests with the learned policies' p).
`--switch-at STEP:MODE,...` switches the learned policies' mode (lpc, lru, shadow) before those
steps: the kill switch, while the engine runs. The plugin's policies reach vLLM as a
deployment runs them: vLLM's own `--scheduler-cls` naming
`lpc.integrations.vllm_scheduler_class.LPCScheduler`, their settings the `lpc` table of
`--additional-config`, nothing patched; `lru` and `installed` run stock vLLM.

Reported per policy: the token hit ratio of vLLM's own `SchedulerStats` (prefix-cache hits /
queries of first admissions, as `vllm:prefix_cache_hits` / `vllm:prefix_cache_queries`
count them; a preempted request's second lookup is counted apart), steps, preemptions,
tokens recomputed after a preemption, chunked prefills (prefills spread over several steps),
evictions; a shadow's two hit ratios; with `--time-steps`, the scheduler thread's CPU time in
vLLM's calls (add_request, schedule, update_from_output: the plugin's release and scoring
included) and its ratio to `lru`'s; with `--interleave` as well,
stock vLLM's `Scheduler` runs in each plugin policy's process over the same requests, the two
stepped in turn, and the ratio of their CPU (in all, per-step p50 and p99, a 95 % interval by
a bootstrap over blocks of steps) is reported: the ratio that the load on a shared machine
moves least. Checked: `lpc-const`, `shadow` and `shadow-pooled`
schedule exactly as `lru` at every step (tokens per request, preemptions, prefix hits, the
blocks allocated); while a plugin run is in lru or shadow mode, each block it evicts is the one
stock vLLM's `FreeKVCacheBlockQueue`, fed the same calls, evicts; a shadow's figures equal our
replay of its requests (`lpc.replay.shadow`); every run ends with each block free, every
reference count zero and the free queue holding each block once. Exit status 1 if a check
fails.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "vllm-ab",
        help="serve a trace with vLLM's own scheduler on the CPU, stock and with the plugin",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", help="JSONL trace (lpc ab --export-trace) or a bundled name")
    _add_policy_args(p)
    _add_engine_args(p)
    _add_plugin_args(p)
    _add_run_args(p)
    p.set_defaults(run=run)


def _add_policy_args(p: argparse.ArgumentParser) -> None:
    """Which policies run, and when the kill switch flips them."""
    p.add_argument(
        "--policies",
        default="lru,lpc-const,lpc,lpc-pooled",
        help="lru, floor, lpc-const[=P], lpc, lpc-pooled, lpc-return, shadow, shadow-pooled "
        "(default: lru, lpc-const, lpc, lpc-pooled)",
    )
    p.add_argument(
        "--switch-at",
        default="",
        help="STEP:MODE[,STEP:MODE...]: switch lpc and lpc-pooled to MODE (lpc, lru, shadow) "
        "before that step, as the control file does in a deployment",
    )


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    """vLLM's engine: the pool, the scheduler's budgets and the modelled step time."""
    p.add_argument("--kv-tokens", type=int, required=True, help="KV pool size in tokens")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (16)")
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=2048, help="token budget per step (2048)"
    )
    p.add_argument("--max-num-seqs", type=int, default=64, help="running requests (64)")
    p.add_argument(
        "--max-model-len", type=int, help="default: the longest request, rounded up to a block"
    )
    p.add_argument("--step-base-ms", type=float, default=10.0, help="step time: fixed part (10 ms)")
    p.add_argument(
        "--step-per-token-us",
        type=float,
        default=10.0,
        help="step time: per scheduled token (10 us)",
    )


def _add_plugin_args(p: argparse.ArgumentParser) -> None:
    """The plugin's constants and the models it runs in process."""
    p.add_argument("--scale", type=float, default=1e-2, help="LPC decay scale per second")
    p.add_argument("--fallback-p", type=float, default=0.5, help="the plugin's fallback p")
    p.add_argument(
        "--access-model",
        type=Path,
        help="lpc and lpc-pooled predict each release with this access-only model in process "
        "(LPC_ACCESS_MODEL); without it, each line's probability",
    )
    p.add_argument(
        "--return-model",
        type=Path,
        help="lpc-return computes each release's return curve with this return-time model in "
        "process (LPC_RETURN_MODEL: lpc train-return's artifact or a registry folder)",
    )
    p.add_argument(
        "--conversation-table-max-tokens",
        type=int,
        help="the plugin's LPC_CONVERSATION_TABLE_MAX_TOKENS (its default when not given)",
    )
    p.add_argument(
        "--pooled-memory",
        choices=MEMORIES,
        default=DEFAULT_MEMORY,
        help=f"lpc-pooled's sharing memory, the plugin's LPC_POOLED_MEMORY (default "
        f"{DEFAULT_MEMORY})",
    )


def _add_run_args(p: argparse.ArgumentParser) -> None:
    """The sample, the checks, the timing and the output."""
    p.add_argument(
        "--one-in", type=int, default=1, help="keep one conversation in N (stable crc32)"
    )
    p.add_argument(
        "--check-every",
        type=int,
        default=0,
        help="also check block ownership and reference counts every N steps (0: at the end)",
    )
    p.add_argument(
        "--data-parallel",
        metavar="SIZE:RANK",
        help="serve the trace with the scheduler of rank RANK of a SIZE-rank data-parallel "
        "engine (what that rank's engine core builds; default: no data parallelism)",
    )
    p.add_argument(
        "--time-steps",
        action="store_true",
        help="report each policy's scheduler CPU per step (thread time in vLLM's calls) and its "
        "ratio to lru's; run with --jobs 1 on a quiet machine (the LRU-order check is left out)",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="with --time-steps: each plugin policy's process "
        "also runs stock vLLM's Scheduler over the same requests, the two stepped in turn; "
        "reports the ratio of their scheduler CPU, per-step p50/p99, and a 95 %% interval "
        "(bootstrap over blocks of steps); leave lru out of --policies",
    )
    p.add_argument("--jobs", type=int, default=1, help="policies run at once (1)")
    p.add_argument("--records-dir", type=Path, help="keep the per-step records here")
    p.add_argument("--vllm-python", type=Path, help="python of vLLM's venv (.vllm-venv)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    from lpc.drivers.scheduler_ab import compare, print_table
    from lpc.drivers.vllm_driver import vllm_python_path
    from lpc.drivers.vllm_scheduler import SchedulerRunFailed
    from predictor.atomic_files import check_output_folder

    if args.one_in < 1:
        raise CommandError(f"--one-in must be >= 1, got {args.one_in}")
    if args.interleave and not args.time_steps:
        raise CommandError("--interleave needs --time-steps")
    dp_size, dp_rank = data_parallel_from(args)
    python = args.vllm_python or vllm_python_path()
    if not python.exists():
        raise CommandError(f"no vLLM python at {python}; run scripts/setup_vllm_plugin.sh")
    if args.records_dir is not None:  # the engines write there: checked before they start
        check_output_folder(args.records_dir, "--records-dir")
    engine = engine_settings_from(args, dp_size, dp_rank)
    try:
        result = compare(
            args.trace,
            args.policies,
            engine,
            policy_settings_from(args),
            python,
            args.one_in,
            args.records_dir,
            args.jobs,
            args.switch_at,
            time_steps=args.time_steps,
            interleave=args.interleave,
        )
    except (ValueError, SchedulerRunFailed) as error:
        raise CommandError(str(error)) from None
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0 if result["ok"] else 1


def data_parallel_from(args: argparse.Namespace) -> tuple[int, int]:
    """(size, rank) of --data-parallel SIZE:RANK; (1, 0) without it."""
    if args.data_parallel is None:
        return 1, 0
    size, _, rank = args.data_parallel.partition(":")
    if not (size.isdigit() and rank.isdigit() and 0 <= int(rank) < int(size)):
        raise CommandError(
            f"--data-parallel must be SIZE:RANK with 0 <= RANK < SIZE, got {args.data_parallel!r}"
        )
    return int(size), int(rank)


def engine_settings_from(args: argparse.Namespace, dp_size: int, dp_rank: int):
    """The engine's shape and step-time model from the flags."""
    from lpc.drivers.vllm_scheduler import EngineSettings

    return EngineSettings(
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


def policy_settings_from(args: argparse.Namespace):
    """What the learned policies are given: the fitted scale, the fallback p, the models."""
    from lpc.drivers.release_plan import PluginSettings

    return PluginSettings(
        scale_per_s=args.scale,
        fallback_probability=args.fallback_p,
        access_model=args.access_model,
        conversation_table_max_tokens=args.conversation_table_max_tokens,
        return_model=args.return_model,
        pooled_memory=args.pooled_memory,
    )
