"""Access features: what a serving engine knows about *how* a conversation uses the cache.

One registry, one record per feature. Each record says when a real engine knows the value
(`arrival`: when the request arrives; `scheduling`: when it is scheduled and its cache hit is
known; `release`: when it finishes and frees its blocks, which is when LPC consumes the
prediction) and computes it two ways that must agree:

- from a trace table (training): `from_table(table)` on a pandas frame with one row per request
  and the `REQUEST_COLUMNS` below, sorted by arrival; a row reads only earlier rows of its
  conversation (groupby + shift), never a later one;
- from an engine's state (serving): `from_state(request, conversation)` with the request's own
  `RequestState` and the `ConversationState` its earlier requests left behind.

Values that span decades (token counts, seconds) are log1p-scaled; the artifact stores the
mean and standard deviation each input is standardised with. Nothing here reads an artefact
only a data set has (a segment cut, a label, a later request): a feature must be computable
by an engine at the time its record names.

The prefix a request shares with its conversation's previous request (`shared_prefix_tokens`)
is the engine-side definition of "reusable prefix": the actual cache hit depends on the policy
and the cache size (so in a replay it would differ per policy), while the longest common
prefix of this prompt with the previous request's prompt and output is known at arrival from
the two token sequences alone, and is the most any policy could have hit from that request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

import numpy as np

from predictor.errors import InvalidInputError

if TYPE_CHECKING:  # pandas is imported where a table is read: the engine path needs none
    import pandas as pd

KnownAt = Literal["arrival", "scheduling", "release"]
KNOWN_AT_ORDER: dict[str, int] = {"arrival": 0, "scheduling": 1, "release": 2}

# The per-request facts a trace table carries (training) and an engine records (serving).
REQUEST_COLUMNS = (
    "conversation_id",  # str: the chat the request belongs to
    "arrival_s",  # float: when it arrived
    "completion_s",  # float: when it finished and released its blocks
    "prompt_tokens",  # int
    "output_tokens",  # int
    "shared_prefix_tokens",  # int: longest common prefix with the previous request's tokens
)
OPTIONAL_COLUMNS = ("type",)  # Bailian's request type (text, search, image, file)
REQUEST_TYPES = ("text", "search", "image", "file")


@dataclass(frozen=True)
class RequestState:
    """One request as the engine sees it; `output_tokens` and `completion_s` at release."""

    arrival_s: float
    prompt_tokens: int
    shared_prefix_tokens: int = 0
    output_tokens: int = 0
    completion_s: float | None = None
    request_type: str | None = None


@dataclass(frozen=True)
class ConversationState:
    """What a conversation's earlier requests left behind (empty for its first request).

    `after(request)` is the state the next request sees; an engine keeps one per conversation
    id and replaces it when a request releases its blocks."""

    requests_so_far: int = 0
    first_arrival_s: float | None = None
    last_completion_s: float | None = None
    last_prompt_tokens: int = 0
    last_output_tokens: int = 0
    think_time_sum_s: float = 0.0
    think_times: int = 0
    last_think_time_s: float = 0.0  # the gap before the latest request (0 for a first one)
    output_tokens_sum: int = 0  # output tokens of every earlier request (known at release)

    def think_time_before(self, request: RequestState) -> float | None:
        """Seconds from the previous reply's completion to this arrival (None: first request;
        0 when the previous request was still running: an overlapping branch)."""
        if self.last_completion_s is None:
            return None
        return max(0.0, request.arrival_s - self.last_completion_s)

    def after(self, request: RequestState) -> ConversationState:
        think = self.think_time_before(request)
        completion = request.completion_s if request.completion_s is not None else request.arrival_s
        return replace(
            self,
            requests_so_far=self.requests_so_far + 1,
            first_arrival_s=request.arrival_s
            if self.first_arrival_s is None
            else self.first_arrival_s,
            last_completion_s=completion,
            last_prompt_tokens=request.prompt_tokens,
            last_output_tokens=request.output_tokens,
            think_time_sum_s=self.think_time_sum_s + (think or 0.0),
            think_times=self.think_times + (think is not None),
            last_think_time_s=think or 0.0,
            output_tokens_sum=self.output_tokens_sum + request.output_tokens,
        )


TableFn = Callable[["pd.DataFrame"], "pd.Series"]
StateFn = Callable[[RequestState, ConversationState], float]


@dataclass(frozen=True)
class AccessFeature:
    name: str
    known_at: KnownAt
    description: str
    from_table: TableFn = field(repr=False)
    from_state: StateFn = field(repr=False)
    needs_column: str | None = None  # an optional column the table must hold


# --- table helpers: every one reads the row itself and earlier rows of its conversation ----


def _previous(table: pd.DataFrame, column: str) -> pd.Series:
    return table.groupby("conversation_id", sort=False)[column].shift(1)


def _turn_index(table: pd.DataFrame) -> pd.Series:
    return table.groupby("conversation_id", sort=False).cumcount()


def _think_time(table: pd.DataFrame) -> pd.Series:
    """NaN for a conversation's first request."""
    return (table["arrival_s"] - _previous(table, "completion_s")).clip(lower=0.0)


def _mean_think_time(table: pd.DataFrame) -> pd.Series:
    think = _think_time(table)
    grouped = think.groupby(table["conversation_id"], sort=False)
    total = grouped.cumsum()  # cumsum skips NaN
    count = think.notna().astype(np.int64).groupby(table["conversation_id"], sort=False).cumsum()
    return (total / count.where(count > 0)).fillna(0.0)


def _log1p(values: pd.Series | float) -> pd.Series | float:
    if isinstance(values, int | float):
        return math.log1p(max(0.0, float(values)))
    return np.log1p(values.astype(np.float64).clip(lower=0.0))


def _new_tokens_state(r: RequestState, c: ConversationState) -> float:
    if c.requests_so_far == 0:
        return float(r.prompt_tokens)
    return float(max(0, r.prompt_tokens - c.last_prompt_tokens - c.last_output_tokens))


def _new_tokens_table(t: pd.DataFrame) -> pd.Series:
    previous = _previous(t, "prompt_tokens") + _previous(t, "output_tokens")
    return (t["prompt_tokens"] - previous.fillna(0.0)).clip(lower=0.0)


def _mean_think_state(r: RequestState, c: ConversationState) -> float:
    think = c.think_time_before(r)
    count = c.think_times + (think is not None)
    return (c.think_time_sum_s + (think or 0.0)) / count if count else 0.0


def _mean_output_tokens_table(t: pd.DataFrame) -> pd.Series:
    """Mean output tokens of the conversation's requests so far, this one included."""
    total = t["output_tokens"].astype(np.float64).groupby(t["conversation_id"], sort=False).cumsum()
    return total / (_turn_index(t) + 1)


def _mean_output_tokens_state(r: RequestState, c: ConversationState) -> float:
    return (c.output_tokens_sum + r.output_tokens) / (c.requests_so_far + 1)


def _type_feature(kind: str) -> AccessFeature:
    return AccessFeature(
        f"type_{kind}",
        "arrival",
        f"1 if the request's type is {kind!r} (Bailian traces), else 0",
        lambda t: (t["type"] == kind).astype(np.float64),
        lambda r, c: float(r.request_type == kind),
        needs_column="type",
    )


ACCESS_FEATURES: tuple[AccessFeature, ...] = (
    AccessFeature(
        "log_turn",
        "arrival",
        "log1p(turn index): earlier requests of the conversation",
        lambda t: _log1p(_turn_index(t)),
        lambda r, c: _log1p(c.requests_so_far),
    ),
    AccessFeature(
        "log_prompt_tokens",
        "arrival",
        "log1p(prompt tokens)",
        lambda t: _log1p(t["prompt_tokens"]),
        lambda r, c: _log1p(r.prompt_tokens),
    ),
    AccessFeature(
        "log_new_tokens",
        "arrival",
        "log1p(prompt − previous request's prompt − its output, at least 0): what the user "
        "added this turn (the whole prompt for a first request)",
        lambda t: _log1p(_new_tokens_table(t)),
        lambda r, c: _log1p(_new_tokens_state(r, c)),
    ),
    AccessFeature(
        "log_shared_prefix_tokens",
        "arrival",
        "log1p(tokens the prompt shares with the previous request's prompt + output): the "
        "reusable prefix, the most any cache could hit (0 for a first request)",
        lambda t: _log1p(t["shared_prefix_tokens"]),
        lambda r, c: _log1p(r.shared_prefix_tokens),
    ),
    AccessFeature(
        "shared_prefix_share",
        "arrival",
        "shared prefix tokens / prompt tokens",
        lambda t: (t["shared_prefix_tokens"] / t["prompt_tokens"].clip(lower=1)).astype(np.float64),
        lambda r, c: r.shared_prefix_tokens / max(1, r.prompt_tokens),
    ),
    AccessFeature(
        "log_think_time_s",
        "arrival",
        "log1p(seconds from the previous reply's completion to this arrival; 0 for a first "
        "request or an overlapping branch)",
        lambda t: _log1p(_think_time(t).fillna(0.0)),
        lambda r, c: _log1p(c.think_time_before(r) or 0.0),
    ),
    AccessFeature(
        "log_mean_think_time_s",
        "arrival",
        "log1p(mean think time of the conversation so far, this one included; 0 if none)",
        lambda t: _log1p(_mean_think_time(t)),
        lambda r, c: _log1p(_mean_think_state(r, c)),
    ),
    AccessFeature(
        "log_previous_think_time_s",
        "arrival",
        "log1p(think time before the previous request; 0 if none)",
        lambda t: _log1p(_previous(t.assign(_think=_think_time(t)), "_think").fillna(0.0)),
        lambda r, c: _log1p(c.last_think_time_s),
    ),
    AccessFeature(
        "log_conversation_age_s",
        "arrival",
        "log1p(seconds since the conversation's first arrival)",
        lambda t: _log1p(
            t["arrival_s"] - t.groupby("conversation_id", sort=False)["arrival_s"].transform("min")
        ),
        lambda r, c: _log1p(0.0 if c.first_arrival_s is None else r.arrival_s - c.first_arrival_s),
    ),
    AccessFeature(
        "log_output_tokens",
        "release",
        "log1p(output tokens of this request)",
        lambda t: _log1p(t["output_tokens"]),
        lambda r, c: _log1p(r.output_tokens),
    ),
    *(_type_feature(kind) for kind in REQUEST_TYPES),
    AccessFeature(
        "log_mean_output_tokens",
        "release",
        "log1p(mean output tokens of the conversation's requests so far, this one included): "
        "how long the replies it asks for usually are (the engine sums each finished "
        "request's output in the conversation's state)",
        lambda t: _log1p(_mean_output_tokens_table(t)),
        lambda r, c: _log1p(_mean_output_tokens_state(r, c)),
    ),
)
FEATURES_BY_NAME: dict[str, AccessFeature] = {f.name: f for f in ACCESS_FEATURES}
TURNS_ONLY = ("log_turn",)


class AccessFeatureError(InvalidInputError):
    """An unknown feature name, or a table that lacks what a feature reads."""


def feature(name: str) -> AccessFeature:
    try:
        return FEATURES_BY_NAME[name]
    except KeyError:
        known = ", ".join(FEATURES_BY_NAME)
        raise AccessFeatureError(f"unknown access feature {name!r}; known: {known}") from None


def default_feature_names(table_columns: Sequence[str]) -> tuple[str, ...]:
    """Every feature the table can feed: the type indicators only when it has types."""
    return tuple(
        f.name for f in ACCESS_FEATURES if f.needs_column is None or f.needs_column in table_columns
    )


def known_by(names: Sequence[str]) -> str:
    """The latest moment among the features': when a prediction over them can be made."""
    return max((feature(n).known_at for n in names), key=KNOWN_AT_ORDER.__getitem__)


def check_table(table: pd.DataFrame, names: Sequence[str]) -> None:
    missing = [c for c in REQUEST_COLUMNS if c not in table.columns]
    needed = {f.needs_column for n in names if (f := feature(n)).needs_column}
    missing += sorted(needed - set(table.columns))
    if missing:
        raise AccessFeatureError(f"the request table lacks column(s) {', '.join(missing)}")
    if not table["arrival_s"].is_monotonic_increasing:
        raise AccessFeatureError("the request table must be sorted by arrival_s")


def feature_frame(table: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """One column per feature, one row per request (raw: not standardised)."""
    import pandas as pd

    check_table(table, names)
    return pd.DataFrame({n: feature(n).from_table(table).to_numpy(np.float64) for n in names})


def feature_row(
    names: Sequence[str], request: RequestState, conversation: ConversationState
) -> list[float]:
    """The same values for one request from an engine's state."""
    return [feature(n).from_state(request, conversation) for n in names]
