"""What one change to the replay does to `lpc ab`'s hit ratios, paired: the part the change
studies share (`prefix_closure_change.py`, `pooled_memory_change.py`). Each runs `lpc ab` twice
in one process, once with the change's patch in place, and compares every policy (and
two-tier pair) at every size: both token hit ratios and the change in hit tokens with its
paired 95 % bootstrap interval over the counted conversations (`lpc.replay.intervals`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's packages

import lpc.replay.ab_run as ab_run
from lpc.cli.main import build_parser
from lpc.replay.intervals import paired_gain_interval
from lpc.replay.simulator import RequestHits

# (policy or "GPU+CPU" pair, size or "GPU+CPU" sizes) -> (token hit ratio, hits per request)
Replayed = dict[tuple[str, str], tuple[float, Any]]


def replay(
    argv: list[str],
    patch: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    until_s: float | None = None,
) -> Replayed:
    """`lpc ab argv`'s results inside `patch()`, by (policy, cache size); with --offload-sizes
    also the two-tier results by (GPU + CPU policy, GPU + CPU size), their hits in either
    tier. `until_s`: stop the replay that many seconds after the trace's first arrival."""
    captured = {}
    run_ab = ab_run.run_ab

    def capture(options: Any, *args: Any, **kwargs: Any) -> Any:
        if until_s is not None:
            options = dataclasses.replace(options, replay_until_s=until_s)
        outcome = run_ab(options, *args, **kwargs)
        captured["outcome"] = outcome
        return outcome

    ab_run.run_ab = capture
    try:
        with patch():
            args = build_parser().parse_args(["ab", *argv, "--json"])
            with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
                args.run(args)  # lpc ab's own JSON: not ours
    finally:
        ab_run.run_ab = run_ab
    outcome = captured["outcome"]
    out: Replayed = {
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


def change_rows(before: Replayed, after: Replayed) -> list[dict[str, Any]]:
    """Per policy and size: both hit ratios, and the change in hit tokens with its interval."""
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
    return rows


def row_lines(rows: list[dict[str, Any]], before: str, after: str) -> Iterator[str]:
    """Each row as a line: both ratios, named, and the change with its interval."""
    for row in rows:
        ci = row["ci95"]
        text = "n/a" if ci is None else f"{row['change']:+.2%} [{ci[0]:+.2%}, {ci[1]:+.2%}]"
        yield (
            f"{row['policy']:>18} {row['cache_tokens']:>17}: {row['hit_ratio_before']:.2%} "
            f"({before}) -> {row['hit_ratio_after']:.2%} ({after}), hits {text}"
        )
