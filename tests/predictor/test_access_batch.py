"""A batch of engine states through `AccessPredictor.predict` (the predictor server's path)
and `predict_rows` (a scheduler step's finished requests, in process) against `predict_one`
state by state (a release scored alone).

They agree to float32 round-off, not necessarily to the bit: a batch's matrix products (BLAS
gemm) may sum in another order than one row's, and a row's last bits may depend on the other
rows of its batch. So a step that finishes one request gets `predict_one`'s p exactly (the p
the replay computes), and one that finishes several gets each p to round-off."""

from __future__ import annotations

import numpy as np

from predictor.access_features import ConversationState, RequestState, feature_row
from predictor.access_predictor import AccessPredictor
from tests.integrations.access_models import SHIPPED

# Far above float32's round-off on a probability (a few 1e-8 here), far below any difference
# a feature computed otherwise by the two paths would make.
ROUND_OFF = 1e-6


def engine_states(n: int, seed: int = 0) -> list[tuple[RequestState, ConversationState]]:
    """`n` requests as an engine sees them at their release: first turns and later ones."""
    rng = np.random.default_rng(seed)
    states = []
    for _ in range(n):
        turns = int(rng.integers(0, 9))
        request = RequestState(
            arrival_s=100.0,
            prompt_tokens=int(rng.integers(1, 100_000)),
            shared_prefix_tokens=int(rng.integers(0, 3_000)),
            output_tokens=int(rng.integers(0, 2_000)),
            completion_s=110.0,
        )
        conversation = ConversationState(
            requests_so_far=turns,
            first_arrival_s=None if turns == 0 else float(rng.uniform(0, 90)),
            last_completion_s=None if turns == 0 else float(rng.uniform(0, 99)),
            last_prompt_tokens=int(rng.integers(0, 50_000)),
            last_output_tokens=int(rng.integers(0, 2_000)),
            think_time_sum_s=float(rng.uniform(0, 300)) * (turns > 0),
            think_times=max(0, turns - 1),
            output_tokens_sum=int(rng.integers(0, 5_000)) * (turns > 0),
        )
        states.append((request, conversation))
    return states


def test_a_batch_equals_its_rows_one_by_one_to_float32_round_off() -> None:
    model = AccessPredictor.load(SHIPPED)
    states = engine_states(300)
    singles = np.array(
        [model.predict_one(request, conversation) for request, conversation in states]
    )
    assert len(set(singles.tolist())) > 100, "varied probabilities"
    for n in (2, 3, 16, 300):  # gemm's tails and full blocks
        batch = model.predict(model.feature_matrix(states[:n]))
        assert batch.dtype == np.float64 and batch.shape == (n,)
        np.testing.assert_allclose(batch, singles[:n], rtol=0.0, atol=ROUND_OFF)


def test_one_request_from_engine_state_equals_the_batched_row_bit_for_bit() -> None:
    """`predict_one` (every release of a serving engine) takes a shortcut past `predict`'s
    checks; on one row it must still give the very same probability, or the plugin and the
    replay could rank blocks differently."""
    model = AccessPredictor.load(SHIPPED)
    for request, conversation in engine_states(300):
        row = np.array([feature_row(model.feature_names, request, conversation)])
        assert model.predict_one(request, conversation) == float(model.predict(row)[0])


def test_a_step_s_rows_equal_predict_one_to_round_off_and_one_row_to_the_bit() -> None:
    model = AccessPredictor.load(SHIPPED)
    states = engine_states(200, seed=1)
    singles = [model.predict_one(request, conversation) for request, conversation in states]
    rows = [model.state_row(request, conversation) for request, conversation in states]
    for n in (2, 5, 64, 200):
        got = model.predict_rows(rows[:n])
        assert all(type(p) is float for p in got)
        np.testing.assert_allclose(got, singles[:n], rtol=0.0, atol=ROUND_OFF)
    for row, single in zip(rows, singles, strict=True):
        assert model.predict_rows([row]) == [single]
