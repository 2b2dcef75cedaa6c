"""One network from an ensemble's members: the access and the return model's single merge.

Members of one architecture become one wider network of the same kind, so the artifact and
the numpy predictors stay those of a plain MLP: the first layer's outputs stacked, every later
hidden layer block-diagonal (each member's units see only its own). The last layer decides
what comes out:

- "mean" (the access model): the members' last weights side by side, divided by their count,
  the bias their mean: one logit, the mean of the members' logits, exactly.
- "stack" (the return model): block-diagonal like the hidden layers, so the outputs are each
  member's logits in turn; the return predictor averages the members' curves itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

Layer = tuple[Any, Any]  # (weight (out, in), bias (out,)) as `torch.nn.Linear` holds them
OUTPUTS = ("mean", "stack")


def linear_layers(model: torch.nn.Module) -> list[Layer]:
    """The weight and bias of each `Linear` of `model`, in order."""
    return [(m.weight, m.bias) for m in model.modules() if isinstance(m, torch.nn.Linear)]


def merge_layers(members: Sequence[Sequence[Layer]], output: str) -> list[Layer]:
    """The merged network's layers; `output` is "mean" or "stack" (above)."""
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    depths = {len(member) for member in members}
    if len(depths) != 1:
        raise ValueError(f"the members differ in depth: {sorted(depths)} layers")
    last = depths.pop() - 1
    merged: list[Layer] = []
    with torch.no_grad():
        for layer in range(last + 1):
            weights = [member[layer][0].detach() for member in members]
            biases = [member[layer][1].detach() for member in members]
            if layer == last and output == "mean":
                weight = torch.cat(weights, dim=1) / len(members)
                bias = torch.stack(biases).mean(dim=0)
            elif layer == 0:
                weight, bias = torch.cat(weights, dim=0), torch.cat(biases)
            else:
                weight, bias = torch.block_diag(*weights), torch.cat(biases)
            merged.append((weight, bias))
    return merged
