"""The feature registry: every scalar input of every model, one record per feature.

Each record names a feature, says when a real engine knows its value (`arrival`,
`scheduling`, `release`) and how it is computed on each path that can feed it: `from_table`
(training and the trace replay), `from_state` (the vLLM plugin), `from_sample` (training a text
model), `from_window` (`lpc serve`); asking for a feature on a path that cannot compute it is an
error that names it (`check_computable`). Adding a feature is one entry in `ACCESS_FEATURES` or
`TEXT_FEATURES`; everything else reads `FEATURES_BY_NAME`.

The paths, "previous" and the shared prefix: docs/design.md, "The feature registry".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from predictor.errors import InvalidInputError, UserError
from predictor.text_features import (
    MissingPromptTokensError,
    TextSample,
    ends_with_question,
    log_prompt_chars,
    log_prompt_tokens,
    sample_count,
    sample_prompt_tokens,
    window_prompt_tokens,
)

if TYPE_CHECKING:  # pandas is imported where a table is read: the engine path needs none
    import pandas as pd

    from predictor.features import ConversationWindow

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
        # Every field, by the constructor: `dataclasses.replace` costs several times as much,
        # and an engine calls this at every release.
        return ConversationState(
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
SampleFn = Callable[[TextSample], float]
WindowFn = Callable[["ConversationWindow"], float]

# The paths a feature can be computed on, as the errors name them.
FeaturePath = Literal["table", "state", "sample", "window"]
PATHS: dict[str, str] = {
    "table": "a trace table (training an access model, the trace replay)",
    "state": "an engine's request state (the plugin, an access model's RPC item)",
    "sample": "a text training sample (training a text model, the conversation replay)",
    "window": "a text prediction request's window (lpc serve, Predictor.predict)",
}


@dataclass(frozen=True)
class Feature:
    """One model input: its name, when an engine knows it, and its computations per path
    (None: the feature cannot be used on that path)."""

    name: str
    known_at: KnownAt
    description: str
    from_table: TableFn | None = field(default=None, repr=False)
    from_state: StateFn | None = field(default=None, repr=False)
    needs_column: str | None = None  # an optional column the table must hold
    from_sample: SampleFn | None = field(default=None, repr=False)
    from_window: WindowFn | None = field(default=None, repr=False)
    sample_needs_token_counts: bool = False  # from_sample reads the serving token counts
    window_field: str | None = None  # the optional RPC item field from_window reads
    # from_state reads `shared_prefix_tokens`, which an engine gets by comparing token ids
    # with the conversation's previous request (the plugin keeps them only when needed)
    needs_token_ids: bool = False


AccessFeature = Feature  # the name the access entries below are written with


# --- table helpers: every one reads the row itself and earlier rows of its conversation, ---
# --- the rows coming in completion order (`feature_frame`) ---------------------------------


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
        # the whole conversation so far + the new user message, as the serving engine
        # tokenizes it (vLLM's num_prompt_tokens; a sample's request - output tokens)
        from_sample=lambda s: log_prompt_tokens(sample_prompt_tokens(s)),
        from_window=lambda w: log_prompt_tokens(window_prompt_tokens(w)),
        sample_needs_token_counts=True,
        window_field="prompt_tokens",
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
        needs_token_ids=True,
    ),
    AccessFeature(
        "shared_prefix_share",
        "arrival",
        "shared prefix tokens / prompt tokens",
        lambda t: (t["shared_prefix_tokens"] / t["prompt_tokens"].clip(lower=1)).astype(np.float64),
        lambda r, c: r.shared_prefix_tokens / max(1, r.prompt_tokens),
        needs_token_ids=True,
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
        "log1p(seconds since the arrival of the conversation's first finished request)",
        lambda t: _log1p(
            t["arrival_s"]
            - t.groupby("conversation_id", sort=False)["arrival_s"].transform("first")
        ),
        lambda r, c: _log1p(0.0 if c.first_arrival_s is None else r.arrival_s - c.first_arrival_s),
    ),
    AccessFeature(
        "log_output_tokens",
        "release",
        "log1p(output tokens of this request)",
        lambda t: _log1p(t["output_tokens"]),
        lambda r, c: _log1p(r.output_tokens),
        from_sample=lambda s: math.log1p(sample_count(s.output_tokens, "log_output_tokens")),
        sample_needs_token_counts=True,
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
# The text model's scalar extras: computed from a training sample, and those a prediction
# request carries also from its window. (`log_prompt_tokens` and `log_output_tokens` are text
# extras too; their records above hold every computation.)
TEXT_FEATURES: tuple[Feature, ...] = (
    Feature(
        "log_context_chars",
        "release",
        "log1p(characters of every message up to and including the reply): the conversation's size",
        from_sample=lambda s: math.log1p(s.context_chars),
    ),
    Feature(
        "log_reply_chars",
        "release",
        "log1p(characters of the assistant's reply)",
        from_sample=lambda s: math.log1p(len(s.reply)),
    ),
    Feature(
        "reply_asks",
        "release",
        "1 if the reply ends with a question to the user, else 0",
        from_sample=lambda s: ends_with_question(s.reply),
    ),
    Feature(
        "log_prompt_chars",
        "arrival",
        "log1p(characters of the current user prompt)",
        from_sample=lambda s: log_prompt_chars(s.window[-1]),
        from_window=lambda w: log_prompt_chars(w.user_prompts[-1]),
    ),
    Feature(
        "log_request_tokens",
        "release",
        "log1p(prompt + output tokens of the finishing request): the conversation so far",
        from_sample=lambda s: math.log1p(sample_count(s.request_tokens, "log_request_tokens")),
        sample_needs_token_counts=True,
    ),
)
# Every feature by name: the one table every path looks features up in.
FEATURES_BY_NAME: dict[str, Feature] = {f.name: f for f in (*ACCESS_FEATURES, *TEXT_FEATURES)}
TURNS_ONLY = ("log_turn",)


class FeatureError(InvalidInputError):
    """An unknown feature name, a feature a path cannot compute, or a table that lacks what a
    feature reads."""


AccessFeatureError = FeatureError  # its name before text features joined the registry


class UnservableFeaturesError(UserError, ValueError):
    """A text model needs features that a prediction request cannot carry."""


def feature(name: str) -> Feature:
    try:
        return FEATURES_BY_NAME[name]
    except KeyError:
        known = ", ".join(FEATURES_BY_NAME)
        raise FeatureError(f"unknown feature {name!r}; known: {known}") from None


def computable_on(*paths: FeaturePath) -> tuple[str, ...]:
    """The names of every feature all of `paths` can compute, in registry order."""
    return tuple(
        n
        for n, f in FEATURES_BY_NAME.items()
        if all(getattr(f, f"from_{path}") is not None for path in paths)
    )


def not_computable(names: Sequence[str], path: FeaturePath) -> tuple[str, ...]:
    """The names among `names` that `path` cannot compute (unknown names raise)."""
    return tuple(n for n in names if getattr(feature(n), f"from_{path}") is None)


def check_computable(names: Sequence[str], path: FeaturePath, what: str = "the model") -> None:
    """`FeatureError` naming every feature among `names` that `path` cannot compute."""
    missing = not_computable(names, path)
    if missing:
        raise FeatureError(
            f"{what} reads feature(s) {list(missing)}, which cannot be computed from "
            f"{PATHS[path]}; the features that can: {', '.join(computable_on(path))}"
        )


def check_names(names: Sequence[str], what: str, *paths: FeaturePath) -> tuple[str, ...]:
    """The names as a tuple: registered, distinct and computable on each of `paths`;
    otherwise `FeatureError` starting with `what` (e.g. "--access-features")."""
    names = tuple(names)
    for name in names:
        if name not in FEATURES_BY_NAME:
            known = ", ".join(computable_on(*paths))
            raise FeatureError(f"{what}: unknown feature {name!r}; known: {known}")
    if len(set(names)) != len(names):
        raise FeatureError(f"{what}: features listed twice: {list(names)}")
    for path in paths:
        check_computable(names, path, what)
    return names


def check_servable(names: Sequence[str], what: str) -> None:
    """Raise `UnservableFeaturesError` (starting with `what`, e.g. "artifact X") when a text
    model with these features cannot be served from prediction requests' windows."""
    missing = not_computable(names, "window")
    if missing:
        raise UnservableFeaturesError(
            f"{what} needs finish-time features {list(missing)} that a prediction request "
            f"cannot carry (they are known only once the request has finished); a served text "
            f"model may use only {list(computable_on('window'))}"
        )


def features_help(*paths: FeaturePath) -> str:
    """'name (known at), ...' for every feature all of `paths` compute: what CLI help lists."""
    return ", ".join(f"{n} ({feature(n).known_at})" for n in computable_on(*paths))


def default_feature_names(table_columns: Sequence[str]) -> tuple[str, ...]:
    """Every access feature the table can feed (a table and an engine compute it): the type
    indicators only when it has types."""
    return tuple(
        f.name
        for f in FEATURES_BY_NAME.values()
        if f.from_table is not None
        and f.from_state is not None
        and (f.needs_column is None or f.needs_column in table_columns)
    )


def known_by(names: Sequence[str]) -> str:
    """The latest moment among the features': when a prediction over them can be made."""
    return max((feature(n).known_at for n in names), key=KNOWN_AT_ORDER.__getitem__)


def check_table(table: pd.DataFrame, names: Sequence[str]) -> None:
    check_computable(names, "table")
    missing = [c for c in REQUEST_COLUMNS if c not in table.columns]
    needed = {f.needs_column for n in names if (f := feature(n)).needs_column}
    missing += sorted(needed - set(table.columns))
    if missing:
        raise FeatureError(f"the request table lacks column(s) {', '.join(missing)}")
    if not table["arrival_s"].is_monotonic_increasing:
        raise FeatureError("the request table must be sorted by arrival_s")


def completion_order(completion_s: Sequence[float] | np.ndarray) -> np.ndarray:
    """Row positions by completion time, ties in row (arrival) order: the order an engine
    releases requests in, and so the order its conversation table learns them."""
    completion = np.asarray(completion_s, dtype=np.float64)
    return np.lexsort((np.arange(len(completion)), completion))


def feature_frame(table: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """One column per feature, one row per request (raw: not standardised), in the table's
    (arrival) order.

    Each row's history is the requests of its conversation that *completed* before it: the
    table's computations run on the rows in completion order, as an engine records a request
    in its conversation table when the request releases its blocks and predicts at a release.
    Where a conversation's turns do not overlap this is every request that arrived before the
    row; where a turn arrives before its predecessor finished, the predecessor counts only if
    it finished first, exactly as the engine-state form sees it at the release."""
    import pandas as pd

    check_table(table, names)
    order = completion_order(table["completion_s"].to_numpy())
    by_completion = table.iloc[order].reset_index(drop=True)
    values = np.empty((len(table), len(names)), dtype=np.float64)
    for j, name in enumerate(names):
        values[order, j] = feature(name).from_table(by_completion).to_numpy(np.float64)
    return pd.DataFrame(values, columns=list(names))


def feature_row(
    names: Sequence[str], request: RequestState, conversation: ConversationState
) -> list[float]:
    """The same values for one request from an engine's state."""
    return [f(request, conversation) for f in state_functions(names)]


def state_functions(names: Sequence[str]) -> list[StateFn]:
    """The engine-state computations of these features, in order (checked once: a caller
    that predicts at every release keeps the list)."""
    check_computable(names, "state")
    return [feature(n).from_state for n in names]


def needs_token_counts(names: Sequence[str]) -> bool:
    """Whether the samples must carry serving token counts for these features."""
    return any(feature(n).sample_needs_token_counts for n in names)


def sample_matrix(samples: Sequence[TextSample], names: Sequence[str]) -> np.ndarray:
    """float32 (len(samples), len(names)): the features of training samples."""
    functions = [feature(n).from_sample for n in check_names(names, "the model", "sample")]
    out = np.empty((len(samples), len(functions)), dtype=np.float32)
    for i, sample in enumerate(samples):
        for j, function in enumerate(functions):
            out[i, j] = function(sample)
    return out


def window_fields(names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Optional window field -> the features among `names` that read it (e.g.
    {"prompt_tokens": ("log_prompt_tokens",)}): what a text model's RPC items must carry."""
    fields: dict[str, tuple[str, ...]] = {}
    for name in names:
        field_name = feature(name).window_field
        if field_name is not None:
            fields[field_name] = (*fields.get(field_name, ()), name)
    return fields


def windows_lacking(windows: Sequence[ConversationWindow], field_name: str) -> list[int]:
    """Indices of the windows whose optional `field_name` is unset."""
    return [i for i, window in enumerate(windows) if getattr(window, field_name) is None]


def window_matrix(windows: Sequence[ConversationWindow], names: Sequence[str]) -> np.ndarray:
    """float32 (len(windows), len(names)), the same numbers `sample_matrix` gives for the same
    turns. Raises `UnservableFeaturesError`, or `MissingPromptTokensError` naming the windows
    that lack a field the features read."""
    check_servable(names, "the model")
    for field_name, readers in window_fields(names).items():
        missing = windows_lacking(windows, field_name)
        if missing:
            shown = ", ".join(f"{i} ({windows[i].conversation_id!r})" for i in missing[:5])
            raise MissingPromptTokensError(
                f"{len(missing)} window(s) have no {field_name}, which this model needs for "
                f"its {', '.join(readers)} feature: {shown}" + (", ..." if len(missing) > 5 else "")
            )
    functions = [feature(n).from_window for n in names]
    out = np.empty((len(windows), len(functions)), dtype=np.float32)
    for i, window in enumerate(windows):
        for j, function in enumerate(functions):
            out[i, j] = function(window)
    return out
