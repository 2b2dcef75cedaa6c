"""The access-only model's training defaults, in a module that imports nothing.

`lpc train --trace` shows them in its flags' help; keeping them here lets the command line
build its parser where the training extra (pandas, torch) is not installed (`lpc[train]`).
`training.access_data` and `training.access_fit` use them.
"""

from __future__ import annotations

# Label: "the conversation's next request arrives within this many seconds" (access_data).
DEFAULT_ACCESS_HORIZON_S = 180.0
DEFAULT_ACCESS_ENSEMBLE = 4
# Share of the gradient-boosted teacher's probability in each training target (the rest: the
# 0/1 label). 1.0 had the best mean validation AUC over splits 0.33 / 0.5 / 0.67 of 0, 0.5, 0.75
# and 1.0 on Mooncake (docs/results.md).
DEFAULT_TEACHER_SHARE = 1.0
