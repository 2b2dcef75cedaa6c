"""The shared training loop and the ensemble merge of the text, access and return models."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from training.ensemble import linear_layers, merge_layers  # noqa: E402
from training.loop import (  # noqa: E402
    loader_batches,
    permuted_batches,
    train_loop,
)


def _problem(seed: int = 0, rows: int = 40):
    torch.manual_seed(seed)
    x = torch.randn(rows, 3)
    y = (x[:, 0] > 0).float()
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    loss = torch.nn.BCEWithLogitsLoss()
    return model, (lambda m, rows: loss(m(x[rows]).squeeze(-1), y[rows])), rows


def _scripted(losses: list[float]):
    """A validation that returns `losses` in turn and keeps each epoch's weights."""
    seen: list[dict[str, torch.Tensor]] = []

    def validation(model: torch.nn.Module) -> float:
        seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return losses[len(seen) - 1]

    return validation, seen


def _run(losses: list[float], **settings):
    model, batch_loss, rows = _problem()
    validation, seen = _scripted(losses)
    order = permuted_batches(rows, 8, torch.Generator().manual_seed(0))
    return train_loop(
        model, batch_loss, order, learning_rate=1e-2, validation=validation, **settings
    ), seen


def test_keeps_the_best_epoch_and_stops_after_patience_epochs_without_improvement() -> None:
    # 1.99999 is not lower than 2 by more than 1e-5: no improvement, as 2.5 and 4 are not.
    result, seen = _run([3.0, 2.0, 2.5, 1.99999, 4.0, 0.5], max_epochs=10, patience=3)
    assert result.best_epoch == 2 and result.best_loss == 2.0
    assert result.val_losses == [3.0, 2.0, 2.5, 1.99999, 4.0]  # stopped before the 0.5
    for name, value in result.model.state_dict().items():
        assert torch.equal(value, seen[1][name]), name
    assert not torch.equal(seen[1]["0.weight"], seen[3]["0.weight"])  # it did train on
    assert not result.model.training


def test_without_a_threshold_any_lower_loss_improves() -> None:
    result, _ = _run([3.0, 2.0, 1.99999], max_epochs=3, patience=3, min_improvement=0)
    assert result.best_epoch == 3


def test_a_loss_that_is_not_finite_stops_at_once() -> None:
    result, seen = _run([3.0, math.nan, 1.0], max_epochs=10, patience=5)
    assert result.val_losses[:1] == [3.0] and len(result.val_losses) == 2
    assert result.best_epoch == 1
    assert torch.equal(result.model.state_dict()["0.weight"], seen[0]["0.weight"])


def test_without_validation_it_trains_exactly_the_epochs_asked() -> None:
    model, batch_loss, rows = _problem()
    batches: list[int] = []

    def counted(m: torch.nn.Module, rows_: torch.Tensor) -> torch.Tensor:
        batches.append(len(rows_))
        return batch_loss(m, rows_)

    order = permuted_batches(rows, 16, torch.Generator().manual_seed(0))
    result = train_loop(model, counted, order, learning_rate=1e-2, max_epochs=3, patience=1)
    assert batches == [16, 16, 8] * 3
    assert result.best_epoch == 3 and result.best_loss == math.inf and result.val_losses == []


@pytest.mark.parametrize("make", [permuted_batches, loader_batches])
def test_each_epoch_is_a_seeded_permutation_of_every_row(make) -> None:
    def epochs(seed: int) -> list[list[int]]:
        order = make(10, 4, torch.Generator().manual_seed(seed))
        return [torch.cat(list(order())).tolist() for _ in range(3)]

    first = epochs(5)
    assert all(sorted(epoch) == list(range(10)) for epoch in first)
    assert first == epochs(5)
    assert first != epochs(6)
    assert first[0] != first[1]
    assert [len(b) for b in make(10, 4, torch.Generator().manual_seed(0))()] == [4, 4, 2]


def test_the_two_orders_draw_differently_from_one_seed() -> None:
    """Each form is kept for the models trained with it: they are not interchangeable."""
    a = torch.cat(list(permuted_batches(50, 8, torch.Generator().manual_seed(0))()))
    b = torch.cat(list(loader_batches(50, 8, torch.Generator().manual_seed(0))()))
    assert a.tolist() != b.tolist()


def _members(count: int, outputs: int) -> list[torch.nn.Sequential]:
    members = []
    for seed in range(count):
        torch.manual_seed(seed)
        members.append(
            torch.nn.Sequential(
                torch.nn.Linear(3, 5),
                torch.nn.ReLU(),
                torch.nn.Linear(5, 4),
                torch.nn.ReLU(),
                torch.nn.Linear(4, outputs),
            )
        )
    return members


def _network(layers) -> torch.nn.Sequential:
    modules: list[torch.nn.Module] = []
    for i, (weight, bias) in enumerate(layers):
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            linear.weight.copy_(weight)
            linear.bias.copy_(bias)
        modules += [linear] if i == len(layers) - 1 else [linear, torch.nn.ReLU()]
    return torch.nn.Sequential(*modules)


def test_mean_merge_gives_the_members_mean_logit() -> None:
    members = _members(3, 1)
    merged = _network(merge_layers([linear_layers(m) for m in members], "mean"))
    assert [w.shape for w, _ in linear_layers(merged)] == [(15, 3), (12, 15), (1, 12)]
    x = torch.randn(20, 3)
    with torch.no_grad():
        expected = torch.stack([m(x) for m in members]).mean(dim=0)
        assert torch.allclose(merged(x), expected, atol=1e-6)


def test_stack_merge_gives_each_members_outputs_in_turn() -> None:
    members = _members(2, 3)
    merged = _network(merge_layers([linear_layers(m) for m in members], "stack"))
    x = torch.randn(20, 3)
    with torch.no_grad():
        expected = torch.cat([m(x) for m in members], dim=1)
        assert torch.allclose(merged(x), expected, atol=1e-6)


def test_a_single_member_merges_into_itself() -> None:
    (member,) = _members(1, 2)
    for output in ("stack", "mean"):
        for (w, b), (mw, mb) in zip(
            merge_layers([linear_layers(member)], output), linear_layers(member), strict=True
        ):
            assert torch.equal(w, mw) and torch.equal(b, mb)


def test_merge_refuses_an_unknown_output_and_members_of_different_depth() -> None:
    members = _members(2, 1)
    with pytest.raises(ValueError, match="output"):
        merge_layers([linear_layers(m) for m in members], "median")
    shallow = torch.nn.Sequential(torch.nn.Linear(3, 1))
    with pytest.raises(ValueError, match="depth"):
        merge_layers([linear_layers(members[0]), linear_layers(shallow)], "mean")
