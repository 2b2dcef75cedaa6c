"""What keeping `lpc-pooled`'s sharing memory by chain (or by block) instead of by content
changes in `lpc ab`'s hit ratios, paired.

    python scripts/studies/pooled_memory_change.py [--memory chains|blocks] [--replay-until S]
        [lpc ab's arguments] [--json]

Runs `lpc ab` with the given arguments twice in one process: once with `lpc-pooled`'s hash
memory (`memory="content"`, each content's last release, kept across evictions) and once with
`--memory` (default `chains`: one entry per release under its top hash; `blocks`: what each
block's own metadata says while it holds its content; `eviction/lpc_pooled.py`), the
registry's `lpc-pooled` built with one or the other in both tiers. For every policy (and
two-tier pair) and size it prints both token hit ratios and the change in hit tokens with its
paired 95 % bootstrap interval over the counted conversations (`lpc.replay.intervals`).
`--replay-until S` stops the replay at S seconds after the trace's first arrival (the training
part alone: `--split-at 884 --replay-until 1768`).
The rules that read it: docs/results.md, "`lpc-pooled`'s sharing memory kept by block" and
"... kept by chain".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's packages

import eviction.registry as registry
import lpc.replay.ab_run as ab_run
from eviction.lpc_pooled import MEMORIES, PooledLPCEvictor
from lpc.cli.main import build_parser
from lpc.replay.intervals import paired_gain_interval
from lpc.replay.simulator import RequestHits


def replay(argv: list[str], memory: str, until_s: float | None) -> dict:
    """`lpc ab argv`'s results by (policy, cache size) with `lpc-pooled`'s `memory`; with
    --offload-sizes also the two-tier results by (GPU + CPU policy, GPU + CPU size), their
    hits in either tier."""
    captured = {}
    run_ab = ab_run.run_ab

    def capture(options, *args, **kwargs):
        if until_s is not None:
            options = dataclasses.replace(options, replay_until_s=until_s)
        outcome = run_ab(options, *args, **kwargs)
        captured["outcome"] = outcome
        return outcome

    entry = registry.POLICIES["lpc-pooled"]
    ab_run.run_ab = capture
    registry.POLICIES["lpc-pooled"] = dataclasses.replace(
        entry, factory=functools.partial(PooledLPCEvictor, memory=memory)
    )
    try:
        args = build_parser().parse_args(["ab", *argv, "--json"])
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            args.run(args)  # lpc ab's own JSON: not ours
    finally:
        ab_run.run_ab = run_ab
        registry.POLICIES["lpc-pooled"] = entry
    outcome = captured["outcome"]
    out: dict = {
        (r.policy, str(r.cache_tokens)): (r.token_hit_ratio, r.per_request) for r in outcome.results
    }
    for r in outcome.two_tier:
        hits = r.request_hits
        either = (
            None
            if hits is None
            else RequestHits(hits.device_hit_tokens + hits.host_hit_tokens, hits.conversations)
        )
        key = (f"{r.policy}+{r.offload_policy}", f"{r.cache_tokens}+{r.offload_tokens}")
        out[key] = (r.hit_ratio, either)
    return out


def main() -> int:
    argv = [a for a in sys.argv[1:] if a != "--json"]
    as_json = "--json" in sys.argv[1:]
    until_s = None
    memory = "chains"
    if "--memory" in argv:
        at = argv.index("--memory")
        memory = argv[at + 1] if at + 1 < len(argv) else ""
        if memory not in MEMORIES or memory == "content":
            print("pooled_memory_change: --memory must be chains or blocks", file=sys.stderr)
            return 2
        del argv[at : at + 2]
    if "--replay-until" in argv:
        at = argv.index("--replay-until")
        try:
            until_s = float(argv[at + 1])
        except (IndexError, ValueError):
            print("pooled_memory_change: --replay-until needs a number of seconds", file=sys.stderr)
            return 2
        del argv[at : at + 2]
    content = replay(argv, "content", until_s)
    variant = replay(argv, memory, until_s)
    rows = []
    for key, (new_ratio, new_hits) in variant.items():
        old_ratio, old_hits = content[key]
        interval = (
            None
            if new_hits is None or old_hits is None
            else paired_gain_interval(new_hits, old_hits)
        )
        rows.append(
            {
                "policy": key[0],
                "cache_tokens": key[1],
                "hit_ratio_content": old_ratio,
                "memory": memory,
                "hit_ratio_variant": new_ratio,
                "change": None if interval is None else interval.gain,
                "ci95": None if interval is None else interval.to_list(),
            }
        )
    if as_json:
        print(
            json.dumps(
                {"lpc_ab_args": argv, "memory": memory, "replay_until_s": until_s, "rows": rows}
            )
        )
        return 0
    for row in rows:
        ci = row["ci95"]
        text = "n/a" if ci is None else f"{row['change']:+.2%} [{ci[0]:+.2%}, {ci[1]:+.2%}]"
        print(
            f"{row['policy']:>18} {row['cache_tokens']:>17}: {row['hit_ratio_content']:.2%} "
            f"(content) -> {row['hit_ratio_variant']:.2%} ({memory}), hits {text}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
