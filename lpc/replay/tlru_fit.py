"""T-LRU's two constants (`eviction/tlru.py`, `eviction/sglang_tlru.py`) from a training part.

Q̂ is the median of follow-up turns' new blocks and ξ their 0.9 quantile (rounded up); with no
follow-up turn in the training part both are 0 and T-LRU is LRU. The rule, written down before
any evaluation request is replayed: docs/design.md, "Fitting rules".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lpc.workload import WorkloadRequest

THRESHOLD_QUANTILE = 0.9


@dataclass(frozen=True)
class TLRUFit:
    threshold_blocks: int
    next_prompt_blocks: int
    follow_ups: int
    fitted_on: str

    def evictor_options(self) -> dict[str, Any]:
        return {
            "threshold_blocks": self.threshold_blocks,
            "next_prompt_blocks": self.next_prompt_blocks,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.evictor_options(),
            "follow_ups": self.follow_ups,
            "fitted_on": self.fitted_on,
            "rule": "next_prompt_blocks = the median and threshold_blocks the "
            f"{THRESHOLD_QUANTILE:g} quantile of a follow-up turn's new prompt blocks (beyond "
            "its previous request's prompt and reply) on the training part",
        }


def new_prompt_blocks(requests: Sequence[WorkloadRequest], block_size: int) -> list[int]:
    """Each follow-up turn's new full prompt blocks beyond its conversation's previous request
    (prompt and reply), in arrival order; a conversation's first request adds none."""
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    previous: dict[str, int] = {}
    out: list[int] = []
    for request in sorted(requests, key=lambda r: r.arrival_s):
        turn = request.turn
        prompt_blocks = turn.num_prompt_tokens // block_size
        before = previous.get(turn.conversation_id)
        if before is not None:
            out.append(max(prompt_blocks - before, 0))
        previous[turn.conversation_id] = len(turn.token_ids) // block_size
    return out


def fit_tlru(requests: Sequence[WorkloadRequest], block_size: int, fitted_on: str) -> TLRUFit:
    new = new_prompt_blocks(requests, block_size)
    if not new:
        return TLRUFit(0, 0, 0, fitted_on)
    median = round(float(np.median(new)))
    threshold = math.ceil(float(np.quantile(new, THRESHOLD_QUANTILE)))
    return TLRUFit(threshold, median, len(new), fitted_on)
