"""The daily job's promotion rule, one for every model it retrains: a candidate replaces the
current model unless it is worse by more than a tolerance on one metric, judged on the same
held-out samples (`training.retrain` for the access and text models, on ROC-AUC by default;
`training.return_retrain` for the return-time model, on the integrated Brier score)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str


def decide(
    candidate: dict[str, Any],
    current: dict[str, Any] | None,
    metric: str,
    tolerance: float,
    evaluation_samples: int,
    min_samples: int,
    current_problem: str | None = None,
    *,
    lower_is_better: bool = False,
    label: str | None = None,
    model: str = "model",
    samples: str = "held-out samples",
    undefined_because: str = "one class only",
    note: str = "",
) -> Decision:
    """Promote unless the candidate is worse than the current model by more than tolerance
    on `metric` (higher is better unless `lower_is_better`). Without a usable current model
    the candidate is promoted; with fewer than `min_samples` held-out samples the current one
    is kept. `label`, `model`, `samples`, `undefined_because` and `note` only word the
    reason."""
    if current_problem is not None:
        return Decision(True, f"the current {model} cannot be used ({current_problem})")
    if current is None:
        return Decision(True, f"no current {model}")
    if evaluation_samples < min_samples:
        return Decision(
            False,
            f"only {evaluation_samples} {samples} (< {min_samples}): "
            f"too few to judge, keeping the current {model}",
        )
    name = label or metric
    new, old = candidate.get(metric), current.get(metric)
    if new is None or old is None:
        why = f" ({undefined_because})" if undefined_because else ""
        return Decision(False, f"{name} is undefined on the {samples}{why}")
    delta = new - old
    terms = [f"Δ {delta:+.4f}", *(["lower is better"] if lower_is_better else [])]
    terms.append(f"tolerance {tolerance:.4f}")
    verdict = (
        f"candidate {name} {new:.4f} vs current {old:.4f} "
        f"({', '.join(terms)}{f'; {note}' if note else ''})"
    )
    not_worse = delta <= tolerance if lower_is_better else delta >= -tolerance
    return Decision(not_worse, f"{'not worse' if not_worse else 'worse'}: {verdict}")
