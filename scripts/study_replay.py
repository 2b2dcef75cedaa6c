"""The Mooncake replays of the training-part studies, with `lpc-return` built another way.

`scripts/return_bound_shared.py` and `scripts/return_model_choices.py` replay the same
trace with the `lpc-return` evictor built by another factory (a subclass, or other
constants) and read back the hit ratio per policy and size. The registry entry is swapped
for the replay and restored after it, whatever happens.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import eviction.registry as registry
from lpc.access.source import access_source_factory
from lpc.replay.ab_pipeline import ABOptions, ABOutcome, run_ab
from lpc.replay.policies import parse_policies
from lpc.replay.two_tier import TierSettings

# The training part alone: split at its middle, stopped at the default cut (1,768 s).
TRAINING_PART = {"split_at": 884.0, "replay_until_s": 1768.0}
# The access model `lpc ab --trace mooncake` reads by default (trained on the default split).
SHIPPED_ACCESS_MODEL = Path(__file__).resolve().parents[1] / "models" / "mooncake-access"


def quiet(_: str) -> None:
    """A replay's log, dropped: `--json` prints the report alone."""


def two_tier_ab(
    model: Path,
    gpu_policies: str,
    cpu_policies: str,
    gpu_tokens: int,
    cpu_sizes: Sequence[int],
    out: Path,
    **options: Any,
) -> ABOutcome:
    """`lpc ab --trace mooncake` of every GPU × CPU policy pair, one GPU size, the CPU sizes,
    with the access model in `model`; `options` go to `ABOptions` (e.g. `TRAINING_PART`)."""
    return run_ab(
        ABOptions(
            trace=Path("mooncake"),
            policies=tuple(parse_policies(gpu_policies)),
            cache_sizes_tokens=(gpu_tokens,),
            tiers=TierSettings(tuple(cpu_sizes), tuple(parse_policies(cpu_policies))),
            model_reads_text=False,
            out_dir=out,
            progress=False,
            **options,
        ),
        model_factory=access_source_factory(model, log=quiet),
        log=quiet,
    )


def two_part_arguments(doc: str, out: str) -> argparse.Namespace:
    """The command line of a script that replays the training part with `--model` (an access
    model trained before 884 s) and the evaluation part with the shipped one."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument(
        "--model", type=Path, required=True, help="access model trained before 884 s"
    )
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--json", action="store_true", help="print JSON")
    return parser.parse_args()


def replay_with_return_evictor(
    factory: Callable[..., Any],
    policies: str,
    sizes: Sequence[int],
    out: Path,
    **options: Any,
) -> dict[str, dict[int, float]]:
    """Hit ratio per policy and size of `lpc ab --trace mooncake` with `lpc-return` built by
    `factory`; `options` go to `ABOptions` (e.g. `TRAINING_PART`, `return_model`)."""
    entry = registry.POLICIES["lpc-return"]
    registry.POLICIES["lpc-return"] = dataclasses.replace(entry, factory=factory)
    try:
        outcome = run_ab(
            ABOptions(
                trace=Path("mooncake"),
                policies=tuple(parse_policies(policies)),
                cache_sizes_tokens=tuple(sizes),
                model_reads_text=False,
                out_dir=out,
                progress=False,
                **options,
            ),
            log=lambda _: None,
        )
    finally:
        registry.POLICIES["lpc-return"] = entry
    return {policy: dict(curve) for policy, curve in outcome.comparison.hit_ratio.items()}


def gap_closed(hit: float, lru: float, belady: float) -> float:
    """The share of the LRU→Belady gap a hit ratio closes (0 where there is no gap)."""
    return (hit - lru) / (belady - lru) if belady > lru else 0.0
