"""What a trace does not record but a replay needs: completions, labels and the time split.

Production traces give arrivals only. Completion times come from the latency model (prefill
plus decode, as for generated workloads); the oracle's label is whether the conversation's
next request arrives within a horizon after this one completes; the split cuts the trace in
time into a training part (the cache warms up, predictors are fitted) and an evaluation part
(hit ratios are counted).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from lpc.errors import InvalidInputError
from lpc.traces.expand import SyntheticTokens
from lpc.workload import LatencyModel, ScriptedTurn, WorkloadRequest, compact_tokens

DAY_S = 86_400.0
DEFAULT_HORIZON_S = 1800.0
DEFAULT_SPLIT_AT = 0.5


def complete(requests: Sequence[WorkloadRequest], latency: LatencyModel) -> None:
    """Set each request's completion from its arrival and lengths (cache hits ignored)."""
    for request in requests:
        turn = request.turn
        request.completion_s = request.arrival_s + latency.duration_s(
            turn.num_prompt_tokens, 0, turn.num_output_tokens
        )


@dataclass(frozen=True)
class HorizonLabels:
    labels: list[bool]
    censored: int  # requests whose horizon runs past the trace's end with no next request seen


def horizon_labels(requests: Sequence[WorkloadRequest], horizon_s: float) -> HorizonLabels:
    """True when the conversation's next request arrives at most `horizon_s` after this one
    completes. A request with no later request whose horizon runs past the last arrival is
    censored: the trace cannot say whether the conversation ended, and it counts as
    continuing (true), so the oracle never claims an end it did not see."""
    table = pd.DataFrame(
        {
            "conversation": [r.conversation_id for r in requests],
            "arrival_s": [r.arrival_s for r in requests],
            "completion_s": [r.completion_s for r in requests],
        }
    )
    end_s = table["arrival_s"].max()
    next_arrival = table.groupby("conversation", sort=False)["arrival_s"].shift(-1)
    within = (next_arrival - table["completion_s"]) <= horizon_s
    censored = next_arrival.isna() & (table["completion_s"] + horizon_s > end_s)
    labels = (within | censored).tolist()
    return HorizonLabels(labels, int(censored.sum()))


def cut_to_max_model_len(
    requests: Sequence[WorkloadRequest], max_model_len: int
) -> tuple[list[WorkloadRequest], int]:
    """Requests cut to `max_model_len` tokens (prompt first, then output), and how many were
    cut. A served model cannot hold more; a replay that kept them would cache tokens no
    engine would have."""
    out: list[WorkloadRequest] = []
    cut = 0
    for request in requests:
        turn = request.turn
        if len(turn.token_ids) <= max_model_len:
            out.append(request)
            continue
        cut += 1
        num_prompt = min(turn.num_prompt_tokens, max_model_len)
        num_output = min(turn.num_output_tokens, max_model_len - num_prompt)
        tokens = turn.token_ids
        if isinstance(tokens, SyntheticTokens):
            bs = tokens.trace_block_size
            covered = num_prompt + (num_output if tokens.covers_output else 0)
            cut_tokens = SyntheticTokens(
                tokens.block_ids[: -(-covered // bs)],
                bs,
                num_prompt,
                num_output,
                tokens.output_base,
                tokens.covers_output,
            )
        else:
            cut_tokens = compact_tokens(
                [*tokens[:num_prompt], *tokens[turn.num_prompt_tokens :][:num_output]]
            )
        new_turn = ScriptedTurn(
            turn.conversation_id,
            turn.turn_index,
            cut_tokens,
            num_prompt,
            turn.has_next_turn,
            turn.user_prompts,
            turn.cache_salt,
            turn.lora_id,
        )
        out.append(
            WorkloadRequest(request.request_id, new_turn, request.arrival_s, request.completion_s)
        )
    return out, cut


@dataclass(frozen=True)
class TimeSplit:
    """Requests [0, first_eval) are the training part, the rest the evaluation part."""

    cut_s: float
    first_eval: int
    num_requests: int
    start_s: float = 0.0  # the first arrival

    @property
    def train_requests(self) -> int:
        return self.first_eval

    @property
    def eval_requests(self) -> int:
        return self.num_requests - self.first_eval

    def to_dict(self) -> dict[str, float | int]:
        return {
            "cut_s": self.cut_s,
            "cut_after_start_s": self.cut_s - self.start_s,
            "train_requests": self.train_requests,
            "eval_requests": self.eval_requests,
        }


def split_in_time(requests: Sequence[WorkloadRequest], split_at: float) -> TimeSplit:
    """`split_at` < 1 is a fraction of the arrival span, otherwise seconds after the first
    arrival; requests arriving before the cut are the training part (sorted input).

    A trace whose requests all arrive at once (a span of 0 s: one request) leaves the
    training part empty under any split; what needs a fit on it says so to its caller."""
    if not math.isfinite(split_at) or split_at < 0:
        raise InvalidInputError(
            f"--split-at must be a fraction in [0, 1) or seconds >= 1, got {split_at}"
        )
    first = requests[0].arrival_s if requests else 0.0
    last = requests[-1].arrival_s if requests else 0.0
    cut_s = first + (split_at * (last - first) if split_at < 1 else split_at)
    first_eval = next((i for i, r in enumerate(requests) if r.arrival_s >= cut_s), len(requests))
    if first_eval == len(requests):
        raise InvalidInputError(
            f"--split-at {split_at:g} leaves no request to evaluate (cut at {cut_s - first:g} s "
            f"after the first arrival; the trace spans {last - first:g} s)"
        )
    return TimeSplit(cut_s, first_eval, len(requests), first)


def arrival_after_gap(requests: Sequence[WorkloadRequest], index: int) -> str:
    """`'c9#0', arrives 3.0 days after the one before it`: request `index` and the gap before
    it, as a refusal of a part too thin to learn or judge on names it. One request stamped
    days ahead is such a part, and the empty span before it is the real cause, which advice
    about the horizon or the split would hide (the daily job and `lpc train --trace` alike)."""
    request = requests[index]
    words = repr(request.request_id)
    if index > 0:
        gap_s = request.arrival_s - requests[index - 1].arrival_s
        gap = f"{gap_s / DAY_S:.1f} days" if gap_s >= DAY_S else f"{gap_s:,.0f} s"
        words += f", arrives {gap} after the one before it"
    return words


def training_turn_counts(requests: Sequence[WorkloadRequest], split: TimeSplit) -> list[int]:
    """Per conversation seen in the training part, its turns there (censored at the cut:
    later turns are the evaluation part's future)."""
    turns: dict[str, int] = {}
    for request in requests[: split.first_eval]:
        conv = request.conversation_id
        turns[conv] = max(turns.get(conv, 0), request.turn.turn_index + 1)
    return list(turns.values())
