"""A synthetic fleet-day, end to end: the fleet replay and the daily job on its request logs,
each timed with its peak memory.

The fleet-day is the bundled Mooncake hour scaled to k copies (`lpc.fleet.scale`: fresh block
ids per copy, arrivals shifted by a fraction of a gap; k = 83 gives about 1M requests). Its
requests are written as request logs, one file per instance (`lpc.fleet.request_logs`: the
conversation's session-sticky home among `--instances`, default k), stamped from
`--start` UTC. Then, each as a separate process under `/usr/bin/time -v` (wall time,
processor time, peak resident memory of the process):
1. `lpc fleet` at the matching instance count (k copies on `--instances` instances, the
   session-sticky router, `--policies` at one `--cache-size`), serially;
2. `lpc retrain --logs` on the shards, serially and with `--ray --workers W` (each Ray
   worker's peak memory comes from the job's own report, `data.read.worker_peak_bytes`);
3. `stages`, in this process: the daily job's stages one by one (read, request table,
   samples, fit), serially, then the read and the table on Ray, the driver's processor time
   apart from the tasks' (`/usr/bin/time` counts Ray's processes with the driver).
Run it with `nice -n 10`. `--json` prints every figure; `--skip` leaves steps out.

    nice -n 10 .venv/bin/python scripts/fleet_day.py --copies 83 --out results/fleet-day-83 \
        --no-return-model --skip stages --json      # about 1M requests (docs/results.md)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STEPS = ("replay", "retrain-serial", "retrain-ray", "stages")
TIME_FIELDS = {
    "wall": re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)"),
    "user_s": re.compile(r"User time \(seconds\): ([\d.]+)"),
    "system_s": re.compile(r"System time \(seconds\): ([\d.]+)"),
    "peak_kib": re.compile(r"Maximum resident set size \(kbytes\): (\d+)"),
}


def _wall_seconds(text: str) -> float:
    """`h:mm:ss` or `m:ss.ss` as seconds."""
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds


def timed(command: list[str], log: Path) -> dict[str, Any]:
    """Run `command` under `/usr/bin/time -v`; its stdout (JSON) is parsed, its stderr kept in
    `log`. A failed command raises with the log's tail."""
    time_bin = shutil.which("time") or "/usr/bin/time"
    with log.open("w") as err:
        done = subprocess.run(
            [time_bin, "-v", *command], stdout=subprocess.PIPE, stderr=err, text=True
        )
    text = log.read_text()
    if done.returncode not in (0, 3):  # retrain: 3 = kept the current model
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{text[-2000:]}")
    found = {k: p.search(text) for k, p in TIME_FIELDS.items()}
    missing = [k for k, m in found.items() if m is None]
    if missing:
        raise SystemExit(f"{log}: /usr/bin/time -v did not report {', '.join(missing)}")
    cpu_s = float(found["user_s"][1]) + float(found["system_s"][1])
    return {
        "command": " ".join(command),
        "exit_code": done.returncode,
        "wall_s": round(_wall_seconds(found["wall"][1]), 1),
        "cpu_s": round(cpu_s, 1),
        "peak_rss_mb": round(int(found["peak_kib"][1]) / 1024, 1),
        "output": json.loads(done.stdout) if done.stdout.strip() else None,
    }


def build(copies: int, instances: int, start: dt.datetime, out: Path) -> dict[str, Any]:
    """The fleet-day's request logs (module docstring); returns what was written."""
    import resource

    from lpc.fleet.request_logs import write_request_logs
    from lpc.fleet.scale import write_scaled_trace
    from lpc.replay.ab_options import TRACE_MAX_MODEL_LEN
    from lpc.traces.load import TraceOptions, load_trace

    started, cpu = time.perf_counter(), time.process_time()
    scaled = write_scaled_trace("mooncake", copies, out / f"mooncake-x{copies}.jsonl.gz")
    trace = load_trace(scaled, TraceOptions(max_model_len=TRACE_MAX_MODEL_LEN))
    logs = out / "logs"
    if logs.exists():
        shutil.rmtree(logs)
    files = write_request_logs(trace.requests, logs, instances, start.timestamp())
    return {
        "copies": copies,
        "instances": instances,
        "requests": len(trace.requests),
        "files": len(files),
        "bytes": sum(f.stat().st_size for f in files),
        "wall_s": round(time.perf_counter() - started, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def stage_costs(logs: Path, workers: int, horizon_s: float = 180.0) -> dict[str, Any]:
    """Processor and wall seconds of each stage of the daily job's trace branch (the
    `TraceLogTrainer` path), serially and on Ray (the driver's and the tasks' apart)."""
    from lpc.access.log_retrain import time_ordered_split
    from lpc.fleet.fanout import Executor, RayMapper, start_ray
    from lpc.fleet.request_logs import (
        TABLE_TASKS_PER_WORKER,
        conversation_groups,
        request_table_apart,
    )
    from lpc.replay.ab_options import TRACE_MAX_MODEL_LEN
    from lpc.replay.request_table import request_table
    from lpc.traces.files import load_lpc_files_apart, load_trace_files
    from lpc.traces.load import TraceOptions
    from predictor.access_features import default_feature_names
    from training.access_data import access_samples
    from training.access_fit import AccessFitConfig, fit_access_model

    paths = sorted(logs.glob("*.jsonl"))
    options = TraceOptions(horizon_s=horizon_s, max_model_len=TRACE_MAX_MODEL_LEN)
    costs: dict[str, Any] = {}

    def stage(name: str, work: Any) -> Any:
        cpu, wall = time.process_time(), time.perf_counter()
        result = work()
        costs[name] = {
            "cpu_s": round(time.process_time() - cpu, 2),
            "wall_s": round(time.perf_counter() - wall, 2),
        }
        return result

    trace = stage("serial_read", lambda: load_trace_files(paths, "lpc", options))
    table = stage("serial_table", lambda: request_table(trace.requests))
    cut_s = time_ordered_split(trace, None).split.cut_s
    names = default_feature_names(list(table.columns))
    samples = stage("samples", lambda: access_samples(table, names, cut_s, horizon_s))
    stage("fit", lambda: fit_access_model(samples, AccessFitConfig()))
    executor = Executor("ray", workers=workers)
    mapper = RayMapper(executor)
    stage("ray_start", lambda: start_ray(executor))
    on_ray = stage("ray_read_driver", lambda: load_lpc_files_apart(paths, options, mapper))
    costs["ray_read_tasks_cpu_s"] = round(mapper.task_cpu_s, 2)
    mapper.task_cpu_s = 0.0
    groups = conversation_groups(on_ray.requests, TABLE_TASKS_PER_WORKER * workers)
    table_on_ray = stage(
        "ray_table_driver", lambda: request_table_apart(on_ray.requests, groups, mapper)
    )
    costs["ray_table_tasks_cpu_s"] = round(mapper.task_cpu_s, 2)
    costs["requests"] = len(trace.requests)
    costs["tables_equal"] = bool(table_on_ray.equals(table))
    return costs


def replay_summary(output: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The fleet's cells: router, policy, hit ratio and its interval."""
    cells = (output or {}).get("cells", [])
    keys = (
        "router", "policy", "instances", "cache_tokens", "requests", "token_hit_ratio",
        "token_hit_ratio_ci95", "gain_over_lru", "gain_over_lru_ci95", "load_imbalance",
        "seconds", "cpu_seconds",
    )  # fmt: skip
    summary = [{k: c.get(k) for k in keys} for c in cells]
    return [{"timings_s": (output or {}).get("timings_s")}, *summary]


def retrain_summary(output: dict[str, Any] | None) -> dict[str, Any]:
    if output is None:
        return {}
    data = output.get("data", {})
    return {
        "status": output.get("status"),
        "requests": data.get("requests"),
        "samples": data.get("samples"),
        "split_rule": data.get("split_rule"),
        "candidate_roc_auc": (output.get("candidate_metrics") or {}).get("roc_auc"),
        "read": data.get("read"),
        "return_model": (output.get("return_model") or {}).get("decision"),
        "seconds": output.get("seconds"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=83, help="k copies (default: %(default)s)")
    parser.add_argument("--instances", type=int, help="instances (default: k)")
    parser.add_argument("--out", type=Path, default=Path("results/fleet-day"))
    parser.add_argument("--start", default="2026-01-01T00:00:00", help="first arrival, UTC")
    parser.add_argument("--policies", default="lru,lpc-pooled")
    parser.add_argument("--cache-size", default="4M", help="per instance (default: 4M)")
    parser.add_argument("--workers", type=int, default=2, help="Ray workers (default: 2)")
    parser.add_argument(
        "--no-return-model", action="store_true", help="retrain the access model only"
    )
    parser.add_argument(
        "--reuse-logs", action="store_true", help="keep the request logs --out already holds"
    )
    parser.add_argument("--skip", default="", help=f"steps to leave out: {', '.join(STEPS)}")
    parser.add_argument("--json", action="store_true", help="print every figure as JSON")
    args = parser.parse_args(argv)
    if args.copies < 1 or (args.instances is not None and args.instances < 1):
        parser.error("--copies and --instances must be >= 1")
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - set(STEPS):
        parser.error(f"--skip: unknown step(s) {', '.join(sorted(skip - set(STEPS)))}")
    try:
        start = dt.datetime.fromisoformat(args.start).replace(tzinfo=dt.UTC)
    except ValueError:
        parser.error(f"--start: not an ISO date and time: {args.start!r}")
    instances = args.instances or args.copies
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    lpc = str(Path(sys.executable).with_name("lpc"))

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report: dict[str, Any] = {}
    if args.reuse_logs and any((out / "logs").glob("*.jsonl")):
        say(f"reusing the request logs in {out / 'logs'}")
    else:
        say(f"building the fleet-day: {args.copies} copies, {instances} instances")
        report["build"] = build(args.copies, instances, start, out)
        say(f"built: {json.dumps(report['build'])}")
    if "replay" not in skip:
        say("replaying the fleet (lpc fleet, serial)")
        run = timed(
            [
                lpc, "fleet", "--instances", str(instances), "--copies", str(args.copies),
                "--routers", "session-sticky", "--policies", args.policies,
                "--cache-sizes", args.cache_size, "--out", str(out / "fleet"),
                "--no-progress", "--json",
            ],
            out / "fleet.log",
        )  # fmt: skip
        run["cells"] = replay_summary(run.pop("output"))
        report["replay"] = run
        say(f"replay: {run['wall_s']} s wall, {run['peak_rss_mb']} MB peak")
    for step, extra in (("retrain-serial", []), ("retrain-ray", ["--ray"])):
        if step in skip:
            continue
        registry = out / f"registry-{step}"
        for folder in (registry, registry.with_name(registry.name + "-return")):
            if folder.exists():
                shutil.rmtree(folder)
        command = [
            lpc, "retrain", "--logs", str(out / "logs"), "--registry", str(registry),
            "--force", "--json", "--workers", str(args.workers), *extra,
        ]  # fmt: skip
        if args.no_return_model:
            command.append("--no-return-model")
        say(f"{step}: {' '.join(command)}")
        run = timed(command, out / f"{step}.log")
        run["outcome"] = retrain_summary(run.pop("output"))
        report[step] = run
        say(f"{step}: {run['wall_s']} s wall, {run['peak_rss_mb']} MB peak")
    if "stages" not in skip:
        say("stages: the daily job's stages one by one, serially and on Ray")
        report["stages"] = stage_costs(out / "logs", args.workers)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for step, figures in report.items():
            if step == "stages":
                print(f"stages: {json.dumps(figures)}")
                continue
            wall, peak = figures.get("wall_s"), figures.get("peak_rss_mb")
            print(f"{step}: {wall} s wall, {figures.get('cpu_s')} processor-s, {peak} MiB peak")
    (out / "fleet_day.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
