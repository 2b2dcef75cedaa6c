"""What prefix closure changed: `lpc ab`'s hit ratios with the leaves-first heap against the
same replay with the keys' order alone (today's figures before the change), paired.

    python scripts/studies/prefix_closure_change.py [lpc ab's arguments] [--json]

Runs `lpc ab` with the given arguments twice in one process: once as the code stands and once
with the run heap's chain links switched off (`RunHeap._link_runs` a no-op), which is the order
before prefix closure, bit for bit: with no link no block is ever held back. For every learned
policy and cache size it prints both token hit ratios and the change with its paired 95 %
bootstrap interval over the evaluation part's conversations (`lpc.replay.intervals`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's packages

import lpc.replay.ab_run as ab_run
from eviction.run_heap import RunHeap
from lpc.cli.main import build_parser
from lpc.replay.intervals import paired_gain_interval
from lpc.replay.simulator import RequestHits


def replay(argv: list[str], closure: bool) -> dict:
    """`lpc ab argv`'s results by (policy, cache size), with or without the chain links; with
    --offload-sizes also the two-tier results by (GPU policy + CPU policy, GPU size, CPU size),
    their hits in either tier."""
    captured = {}
    run_ab = ab_run.run_ab

    def capture(*args, **kwargs):
        outcome = run_ab(*args, **kwargs)
        captured["outcome"] = outcome
        return outcome

    link = RunHeap._link_runs
    ab_run.run_ab = capture
    if not closure:
        RunHeap._link_runs = lambda self, runs, parent_id: None
    try:
        args = build_parser().parse_args(["ab", *argv, "--json"])
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            args.run(args)  # lpc ab's own JSON: not ours
    finally:
        ab_run.run_ab = run_ab
        RunHeap._link_runs = link
    outcome = captured["outcome"]
    out: dict = {
        (r.policy, r.cache_tokens): (r.token_hit_ratio, r.per_request) for r in outcome.results
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
    before = replay(argv, closure=False)
    after = replay(argv, closure=True)
    rows = []
    for key, (new_ratio, new_hits) in after.items():
        old_ratio, old_hits = before[key]
        interval = (
            None
            if new_hits is None or old_hits is None
            else paired_gain_interval(new_hits, old_hits)
        )
        rows.append(
            {
                "policy": key[0],
                "cache_tokens": key[1],
                "hit_ratio_before": old_ratio,
                "hit_ratio_after": new_ratio,
                "change": None if interval is None else interval.gain,
                "ci95": None if interval is None else interval.to_list(),
            }
        )
    if as_json:
        print(json.dumps({"lpc_ab_args": argv, "rows": rows}))
        return 0
    for row in rows:
        ci = row["ci95"]
        text = "n/a" if ci is None else f"{row['change']:+.2%} [{ci[0]:+.2%}, {ci[1]:+.2%}]"
        print(
            f"{row['policy']:>18} {row['cache_tokens']!s:>17}: {row['hit_ratio_before']:.2%} -> "
            f"{row['hit_ratio_after']:.2%}, hits {text}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
