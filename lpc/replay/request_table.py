"""Replayed requests → the request table access features are computed from.

`predictor.access_features` reads a pandas table with one row per request
(`REQUEST_COLUMNS`); this builds it from the harness's `WorkloadRequest`s, the same for
training (`lpc train --trace`) and for the A/B's learned source, so both see identical values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from lpc.workload import WorkloadRequest
from predictor.access_features import completion_order


def common_prefix_tokens(previous: Sequence[int], prompt: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(previous), len(prompt))
    if n == 0:
        return 0
    a = np.asarray(previous[:n], dtype=np.int64)
    b = np.asarray(prompt[:n], dtype=np.int64)
    diff = np.flatnonzero(a != b)
    return int(diff[0]) if diff.size else n


def request_table(
    requests: Sequence[WorkloadRequest], request_types: Sequence[str] | None = None
) -> pd.DataFrame:
    """One row per request, in the given (arrival) order. `shared_prefix_tokens` compares each
    prompt with the prompt and output of the conversation's latest request to finish before
    this one finished, as an engine compares them at the release (`completion_order`)."""
    completion = np.array([r.completion_s for r in requests], dtype=np.float64)
    last_tokens: dict[str, Sequence[int]] = {}
    shared = np.zeros(len(requests), dtype=np.int64)
    for i in completion_order(completion):
        turn = requests[i].turn
        previous = last_tokens.get(turn.conversation_id)
        if previous is not None:  # (a conversation's first request shares nothing)
            shared[i] = common_prefix_tokens(previous, turn.token_ids[: turn.num_prompt_tokens])
        last_tokens[turn.conversation_id] = turn.token_ids
    table = pd.DataFrame(
        {
            "conversation_id": [r.conversation_id for r in requests],
            "arrival_s": np.array([r.arrival_s for r in requests], dtype=np.float64),
            "completion_s": completion,
            "prompt_tokens": np.array([r.turn.num_prompt_tokens for r in requests], np.int64),
            "output_tokens": np.array([r.turn.num_output_tokens for r in requests], np.int64),
            "shared_prefix_tokens": shared,
        }
    )
    if request_types is not None:
        if len(request_types) != len(requests):
            raise ValueError(f"{len(request_types)} request types for {len(requests)} requests")
        table["type"] = list(request_types)
    return table
