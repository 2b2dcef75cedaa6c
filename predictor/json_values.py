"""JSON that every parser reads: non-finite floats become null.

Python's `json` writes NaN and Infinity as bare tokens, which strict parsers (jq, JavaScript,
Go) refuse. A figure that is undefined (an AUC with no control in its slice) is reported as
null instead.
"""

from __future__ import annotations

import math
from typing import Any


def finite_or_none(value: Any) -> Any:
    """`value` with every non-finite float, at any depth of dicts, lists and tuples, as None."""
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "dtype") and getattr(value, "ndim", None) == 0:  # a numpy scalar
        return finite_or_none(value.item())
    return value
