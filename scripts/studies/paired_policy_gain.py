"""The gain of one policy over another (not LRU) on a trace, with its paired 95 % interval.

    python scripts/studies/paired_policy_gain.py --trace mooncake --policy lpc-return-model \
        --baseline lpc-pooled [--cache-sizes 2500000,4000000] [--split-at 0.5] \
        [--return-model DIR] [--out DIR] [--json]

`lpc ab` reports each policy's gain over LRU with a paired bootstrap interval over the
evaluation part's conversations (`lpc.replay.intervals`); whether a policy is below another
learned one needs the same interval for the pair itself: both replay the one prepared
workload, and each resample takes the same conversations for both. The access-feature model
(`models/mooncake-access`) feeds the `lpc`/`lpc-pooled` policies, as in `lpc ab --trace`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's packages

from lpc.access.source import access_source_factory
from lpc.errors import UserError
from lpc.replay.ab import TRACE_CACHE_SIZES_TOKENS
from lpc.replay.ab_options import ABOptions
from lpc.replay.ab_run import run_ab
from lpc.replay.intervals import paired_gain_interval
from lpc.replay.policies import parse_policies
from training.locations import SHIPPED_ACCESS_MODEL_NAME, shipped_model_dir


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(float(part)) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of token counts: {text!r}") from None
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError("cache sizes must be > 0")
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake", help="trace file or bundled name")
    parser.add_argument("--policy", required=True, help="the policy whose gain is measured")
    parser.add_argument("--baseline", required=True, help="the policy it is measured against")
    parser.add_argument("--cache-sizes", type=_sizes, default=TRACE_CACHE_SIZES_TOKENS)
    parser.add_argument("--split-at", type=float, default=None, help="as lpc ab --split-at")
    parser.add_argument("--return-model", type=Path, default=None, help="as lpc ab")
    parser.add_argument(
        "--out", type=Path, default=Path("results/paired"), help="where lpc ab's reports go"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    try:
        specs = tuple(parse_policies(f"{args.policy},{args.baseline}"))
        model = shipped_model_dir(SHIPPED_ACCESS_MODEL_NAME)
        needs_model = any(s.source == "model" for s in specs)
        options = ABOptions(
            trace=Path(args.trace) if Path(args.trace).exists() else args.trace,
            split_at=args.split_at,
            policies=specs,
            cache_sizes_tokens=args.cache_sizes,
            workers=1,
            progress=False,
            out_dir=args.out,
            model_reads_text=False,
            return_model=args.return_model,
        )
        log = (lambda _: None) if args.json else print
        factory = access_source_factory(model, log=log) if needs_model and model else None
        outcome = run_ab(options, model_factory=factory, log=log)
    except UserError as error:
        print(f"paired_policy_gain: error: {error}", file=sys.stderr)
        return 2
    by = {(r.policy, r.cache_tokens): r for r in outcome.results}
    rows = []
    for size in args.cache_sizes:
        ours, theirs = by[(args.policy, size)], by[(args.baseline, size)]
        assert ours.per_request is not None and theirs.per_request is not None
        interval = paired_gain_interval(ours.per_request, theirs.per_request)
        rows.append(
            {
                "cache_tokens": size,
                "policy_hit_ratio": ours.token_hit_ratio,
                "baseline_hit_ratio": theirs.token_hit_ratio,
                "gain": None if interval is None else interval.gain,
                "ci95": None if interval is None else interval.to_list(),
            }
        )
    if args.json:
        print(json.dumps({"policy": args.policy, "baseline": args.baseline, "rows": rows}))
        return 0
    print(f"{args.policy} over {args.baseline}")
    for row in rows:
        ci = row["ci95"]
        text = "n/a" if ci is None else f"{row['gain']:+.1%} [{ci[0]:+.1%}, {ci[1]:+.1%}]"
        print(
            f"{row['cache_tokens']:>11,}: {row['policy_hit_ratio']:.2%} vs "
            f"{row['baseline_hit_ratio']:.2%}, gain {text}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
