"""Access features on hand-made request tables: values, no look-ahead (nothing from a request
that finishes later), engine-state parity."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from predictor.access_features import (
    ACCESS_FEATURES,
    AccessFeatureError,
    ConversationState,
    RequestState,
    completion_order,
    default_feature_names,
    feature,
    feature_frame,
    feature_row,
    known_by,
)


def table() -> pd.DataFrame:
    """Conversation a: three turns; b: one; c: two with the second arriving before the first
    completes (an overlapping branch)."""
    rows = [
        # conversation, arrival, completion, prompt, output, shared, type
        ("a", 0.0, 10.0, 100, 20, 0, "text"),
        ("b", 5.0, 8.0, 50, 5, 0, "search"),
        ("c", 6.0, 30.0, 70, 9, 0, "text"),
        ("c", 20.0, 25.0, 75, 3, 70, "file"),
        ("a", 40.0, 50.0, 150, 30, 120, "text"),
        ("a", 200.0, 210.0, 300, 10, 180, "image"),
    ]
    return pd.DataFrame(
        rows,
        columns=[
            "conversation_id",
            "arrival_s",
            "completion_s",
            "prompt_tokens",
            "output_tokens",
            "shared_prefix_tokens",
            "type",
        ],
    )


NAMES = default_feature_names(list(table().columns))


def test_every_feature_has_a_moment_and_both_forms() -> None:
    for f in ACCESS_FEATURES:
        assert f.known_at in ("arrival", "scheduling", "release")
        assert callable(f.from_table) and callable(f.from_state) and f.description
    assert feature("log_output_tokens").known_at == "release"
    assert known_by(["log_turn", "log_think_time_s"]) == "arrival"
    assert known_by(NAMES) == "release"


def test_values_of_a_third_turn() -> None:
    values = feature_frame(table(), NAMES).iloc[5]
    expected = {
        "log_turn": math.log1p(2),
        "log_prompt_tokens": math.log1p(300),
        "log_new_tokens": math.log1p(300 - 150 - 30),
        "log_shared_prefix_tokens": math.log1p(180),
        "shared_prefix_share": 0.6,
        "log_think_time_s": math.log1p(200 - 50),
        "log_mean_think_time_s": math.log1p((30 + 150) / 2),
        "log_previous_think_time_s": math.log1p(30),
        "log_conversation_age_s": math.log1p(200),
        "log_output_tokens": math.log1p(10),
        "log_mean_output_tokens": math.log1p((20 + 30 + 10) / 3),
        "type_image": 1.0,
        "type_text": 0.0,
    }
    for name, value in expected.items():
        assert values[name] == pytest.approx(value), name


def test_values_of_first_turns_and_an_overlapping_branch() -> None:
    values = feature_frame(table(), NAMES)
    first = values.iloc[1]  # b's only request
    assert first["log_turn"] == 0.0 and first["log_think_time_s"] == 0.0
    assert first["log_new_tokens"] == pytest.approx(math.log1p(50))
    assert first["log_shared_prefix_tokens"] == 0.0 and first["log_conversation_age_s"] == 0.0
    # c's second request arrives at 20 s, before its first (6 s → 30 s) completes, and
    # finishes first (25 s): at its release the engine knows no earlier request of c.
    branch = values.iloc[3]
    assert branch["log_turn"] == 0.0 and branch["log_think_time_s"] == 0.0
    assert branch["log_new_tokens"] == pytest.approx(math.log1p(75))
    assert branch["type_file"] == 1.0
    assert branch["log_mean_output_tokens"] == pytest.approx(math.log1p(3))
    # c's first request, released at 30 s, has the branch as its predecessor.
    first_of_c = values.iloc[2]
    assert first_of_c["log_turn"] == pytest.approx(math.log1p(1))
    assert first_of_c["log_think_time_s"] == 0.0  # 6 - 25 < 0: clipped
    assert first_of_c["log_new_tokens"] == 0.0  # 70 - 75 - 3 < 0: clipped
    assert first_of_c["log_conversation_age_s"] == 0.0  # it arrived before the branch
    assert first_of_c["log_mean_output_tokens"] == pytest.approx(math.log1p((3 + 9) / 2))


def finished_by(t: pd.DataFrame, i: int) -> pd.DataFrame:
    """The rows that completed before row `i` did (ties: earlier rows), and row `i`."""
    position = np.arange(len(t))
    completion = t["completion_s"].to_numpy()
    mine = completion[i]
    return t[(completion < mine) | ((completion == mine) & (position <= i))]


def test_a_row_reads_nothing_from_rows_that_finish_after_it() -> None:
    t = table()
    full = feature_frame(t, NAMES).to_numpy()
    for i in range(len(t)):
        known = finished_by(t, i)
        values = feature_frame(known, NAMES).to_numpy()
        row = list(known.index).index(i)
        np.testing.assert_allclose(values[row], full[i], err_msg=f"row {i}")
    # Changing every row that finishes later leaves a row's features unchanged: row 2 (c's
    # first request) finishes at 30 s, after rows 0, 1 and 3.
    changed = t.copy()
    changed.loc[4:, ["prompt_tokens", "output_tokens"]] = [999, 999]
    changed.loc[4:, "completion_s"] = [500.0, 501.0]
    np.testing.assert_allclose(feature_frame(changed, NAMES).to_numpy()[:4], full[:4])
    changed.loc[2, "output_tokens"] = 999  # c's first request's output: the branch never saw it
    np.testing.assert_allclose(feature_frame(changed, NAMES).to_numpy()[3], full[3])


def test_engine_state_gives_the_table_values() -> None:
    """Releasing each request at its completion, in completion order (the overlapping branch
    included), the engine-state form gives every table value."""
    t = table()
    full = feature_frame(t, NAMES).to_numpy()
    rows = t.to_dict("records")  # plain Python values, as an engine holds them
    states: dict[str, ConversationState] = {}
    for i in completion_order(t["completion_s"].to_numpy()):
        row = rows[i]
        request = RequestState(
            row["arrival_s"],
            row["prompt_tokens"],
            row["shared_prefix_tokens"],
            row["output_tokens"],
            row["completion_s"],
            row["type"],
        )
        conversation = states.get(row["conversation_id"], ConversationState())
        np.testing.assert_allclose(
            feature_row(NAMES, request, conversation), full[i], err_msg=f"row {i}"
        )
        states[row["conversation_id"]] = conversation.after(request)
    assert states["a"].output_tokens_sum == 20 + 30 + 10
    assert states["c"].requests_so_far == 2 and states["c"].last_completion_s == 30.0


def test_types_only_when_the_table_has_them() -> None:
    without = table().drop(columns="type")
    names = default_feature_names(list(without.columns))
    assert not any(n.startswith("type_") for n in names)
    with pytest.raises(AccessFeatureError, match="lacks column"):
        feature_frame(without, ["type_text"])


def test_unknown_names_and_unsorted_tables_are_refused() -> None:
    with pytest.raises(AccessFeatureError, match="unknown feature 'nope'; known: log_turn"):
        feature("nope")
    with pytest.raises(AccessFeatureError, match="sorted by arrival_s"):
        feature_frame(table().iloc[::-1], ["log_turn"])
