"""`lpc bench predictor`'s figures as text: the conditions, a table per window set, the RPC
overhead; the same figures as `--json`, laid out for a reader."""

from __future__ import annotations

from typing import Any


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
