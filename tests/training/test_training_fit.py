"""The text model's fit: deterministic, keeps the lowest-validation-loss checkpoint, learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from predictor.model import MLPConfig
from training.fit import FitConfig, WeightedBCE, balanced_class_weights, fit_mlp


def toy(n: int, seed: int, dim: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Linearly separable-ish data with a 70 % majority class."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim + 1)).astype(np.float32)
    labels = (x[:, 0] + 0.3 * rng.normal(size=n) > -0.5).astype(np.int64)
    return x, labels


CONFIG = MLPConfig(embedding_dim=8, hidden_sizes=(16, 16))


def test_same_seed_same_model_bit_for_bit():
    x, y = toy(600, 0)
    vx, vy = toy(200, 1)
    fit = FitConfig(max_epochs=4, batch_size=64, seed=3)
    a = fit_mlp(x, y, vx, vy, CONFIG, fit)
    b = fit_mlp(x, y, vx, vy, CONFIG, fit)
    for (name, pa), (_, pb) in zip(
        a.model.state_dict().items(), b.model.state_dict().items(), strict=True
    ):
        assert torch.equal(pa, pb), name
    c = fit_mlp(x, y, vx, vy, CONFIG, FitConfig(max_epochs=4, batch_size=64, seed=4))
    assert not torch.equal(a.model.layers[0].weight, c.model.layers[0].weight)


def test_keeps_the_checkpoint_with_the_lowest_validation_loss():
    x, y = toy(300, 0)
    vx, vy = toy(100, 1)
    # a large learning rate overfits: validation loss rises after its minimum
    result = fit_mlp(
        x,
        y,
        vx,
        vy,
        MLPConfig(embedding_dim=8, hidden_sizes=(128, 128)),
        FitConfig(max_epochs=8, patience=8, batch_size=32, learning_rate=3e-2),
    )
    assert result.epochs_run == len(result.val_losses)
    assert result.best_epoch == int(np.argmin(result.val_losses))
    assert result.best_val_loss == min(result.val_losses)
    with torch.no_grad():
        loss = WeightedBCE(result.class_weights)(
            result.model(torch.from_numpy(vx)), torch.from_numpy(vy.astype(np.float32))
        )
    assert float(loss) == pytest.approx(result.best_val_loss, rel=1e-4)


def test_early_stopping_ends_before_max_epochs():
    x, y = toy(300, 0)
    vx, vy = toy(100, 1)
    result = fit_mlp(
        x,
        y,
        vx,
        vy,
        CONFIG,
        FitConfig(max_epochs=20, patience=1, batch_size=16, learning_rate=5e-2),
    )
    assert result.epochs_run < 20


def test_learns_and_up_weights_the_minority_class():
    x, y = toy(1000, 0)
    vx, vy = toy(300, 1)
    result = fit_mlp(
        x, y, vx, vy, CONFIG, FitConfig(max_epochs=8, batch_size=64, learning_rate=5e-3)
    )
    w0, w1 = result.class_weights
    assert y.mean() > 0.6 and w0 > 1 > w1
    with torch.no_grad():
        p = torch.sigmoid(result.model(torch.from_numpy(vx))).numpy()
    accuracy = ((p >= 0.5) == vy).mean()
    assert accuracy > 0.85


def test_balanced_weights():
    assert balanced_class_weights(torch.tensor([1.0, 1.0, 1.0, 0.0])) == (2.0, 4 / 6)
    assert balanced_class_weights(torch.tensor([1.0, 1.0])) == (1.0, 1.0)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match=r"FitConfig\.learning_rate"):
        FitConfig(learning_rate=0)
    with pytest.raises(ValueError, match=r"FitConfig\.class_weighting"):
        FitConfig(class_weighting="inverse")
    with pytest.raises(ValueError, match=r"FitConfig\.accelerator"):
        FitConfig(accelerator="tpu")
    x, y = toy(10, 0)
    with pytest.raises(ValueError, match="columns"):
        fit_mlp(x, y, x, y, MLPConfig(embedding_dim=4), FitConfig(max_epochs=1))
