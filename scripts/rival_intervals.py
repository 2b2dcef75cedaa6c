"""The learned rivals (LRB, 3L-Cache, T-LRU, SGLang's tlru) against LRU and LPC on a trace,
every gain with its paired 95 % interval.

    python scripts/rival_intervals.py [--trace mooncake | --dataset sharegpt]
        [--cache-sizes 2500000,...] [--rivals lrb,3l-cache,tlru,sglang-tlru]
        [--against lpc-pooled,lpc-return-model] [--split-at 0.5] [--return-model DIR]
        [--workers 2] [--out DIR] [--json]

On a trace the access-feature model (`models/mooncake-access`) feeds the LPC policies, as in
`lpc ab --trace`; with `--dataset` the paper's workload is generated from the data set's
evaluation half (`lpc ab`'s defaults) and the shipped text predictor feeds them (`--against
lpc,lpc-pooled` there: the return-time model is a trace's). One `lpc ab` run replays LRU, the
LPC policies and the rivals on the one prepared workload;
each rival's gain over LRU and each LPC policy's gain over the rival are paired bootstrap
intervals over the evaluation part's conversations (`lpc.replay.intervals`): each resample
takes the same conversations for both policies. T-LRU's constants are fitted on the training
part (`lpc.replay.tlru_fit`) and reported under `fitted`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages

from lpc.access.source import access_source_factory
from lpc.errors import UserError
from lpc.replay.ab import DEFAULT_CACHE_SIZES_TOKENS, TRACE_CACHE_SIZES_TOKENS
from lpc.replay.ab_options import ABOptions
from lpc.replay.ab_run import run_ab
from lpc.replay.intervals import paired_gain_interval
from lpc.replay.learned_source import learned_source_factory
from lpc.replay.policies import parse_policies
from training.embedding_cache import EmbedOptions
from training.locations import (
    SHIPPED_ACCESS_MODEL_NAME,
    SHIPPED_MODEL_NAME,
    default_embedding_cache_dir,
    shipped_model_dir,
)

DEFAULT_RIVALS = "lrb,3l-cache,tlru,sglang-tlru"
DEFAULT_AGAINST = "lpc-pooled,lpc-return-model"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(float(part)) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of token counts: {text!r}") from None
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError("cache sizes must be > 0")
    return sizes


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError("no policy given")
    return names


def _interval(ours: Any, theirs: Any) -> dict[str, Any]:
    interval = paired_gain_interval(ours.per_request, theirs.per_request)
    if interval is None:
        return {"gain": None, "ci95": None}
    return {"gain": interval.gain, "ci95": interval.to_list()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake", help="trace file or bundled name")
    parser.add_argument(
        "--dataset", default=None, help="replay this chat data set's workload instead of --trace"
    )
    parser.add_argument("--cache-sizes", type=_sizes, default=None, help="tokens (lpc ab's)")
    parser.add_argument("--rivals", type=_names, default=_names(DEFAULT_RIVALS))
    parser.add_argument(
        "--against", type=_names, default=_names(DEFAULT_AGAINST), help="LPC policies"
    )
    parser.add_argument("--split-at", type=float, default=None, help="as lpc ab --split-at")
    parser.add_argument("--return-model", type=Path, default=None, help="as lpc ab")
    parser.add_argument("--workers", type=int, default=2, help="parallel replay processes")
    parser.add_argument("--out", type=Path, default=Path("results/rivals"), help="lpc ab's files")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    names = list(dict.fromkeys(("lru", *args.against, *args.rivals)))
    log = (lambda _: None) if args.json else print
    on_trace = args.dataset is None
    default_sizes = TRACE_CACHE_SIZES_TOKENS if on_trace else DEFAULT_CACHE_SIZES_TOKENS
    sizes = args.cache_sizes or default_sizes
    try:
        specs = tuple(parse_policies(",".join(names)))
        needs_model = any(s.source == "model" for s in specs)
        common = {
            "policies": specs,
            "cache_sizes_tokens": sizes,
            "workers": args.workers,
            "progress": not args.json,
            "out_dir": args.out,
            "return_model": args.return_model,
        }
        if on_trace:
            trace = Path(args.trace) if Path(args.trace).exists() else args.trace
            options = ABOptions(
                trace=trace, split_at=args.split_at, model_reads_text=False, **common
            )
            model = shipped_model_dir(SHIPPED_ACCESS_MODEL_NAME)
            factory = access_source_factory(model, log=log) if needs_model and model else None
        else:
            options = ABOptions(dataset=args.dataset, **common)
            model = shipped_model_dir(SHIPPED_MODEL_NAME)
            factory = None
            if needs_model and model is not None:
                factory = learned_source_factory(
                    model,
                    default_embedding_cache_dir(),
                    EmbedOptions(progress=not args.json),
                    log=log,
                )
        outcome = run_ab(options, model_factory=factory, log=log)
    except UserError as error:
        print(f"rival_intervals: error: {error}", file=sys.stderr)
        return 2
    by = {(r.policy, r.cache_tokens): r for r in outcome.results}
    rows = []
    for size in sizes:
        lru = by[("lru", size)]
        for rival in args.rivals:
            ours = by[(rival, size)]
            rows.append(
                {
                    "cache_tokens": size,
                    "rival": rival,
                    "hit_ratio": ours.token_hit_ratio,
                    "over_lru": _interval(ours, lru),
                    "lpc_over_rival": {
                        lpc: {
                            "hit_ratio": by[(lpc, size)].token_hit_ratio,
                            **_interval(by[(lpc, size)], ours),
                        }
                        for lpc in args.against
                    },
                    "seconds": ours.seconds,
                }
            )
    fitted = outcome.workload_summary.get("fitted_policies", {})
    if args.json:
        print(json.dumps({"lru": _lru_row(by, sizes), "rows": rows, "fitted": fitted}))
        return 0
    for row in rows:
        line = f"{row['cache_tokens']:>11,} {row['rival']:<12} {row['hit_ratio']:.2%}"
        line += f"  vs lru {_text(row['over_lru'])}"
        for lpc, cell in row["lpc_over_rival"].items():
            line += f"  {lpc} over it {_text(cell)}"
        print(line)
    return 0


def _lru_row(by: dict, sizes: tuple[int, ...]) -> dict[str, float]:
    return {str(size): by[("lru", size)].token_hit_ratio for size in sizes}


def _text(cell: dict[str, Any]) -> str:
    if cell["gain"] is None:
        return "n/a"
    low, high = cell["ci95"]
    return f"{cell['gain']:+.1%} [{low:+.1%}, {high:+.1%}]"


if __name__ == "__main__":
    raise SystemExit(main())
