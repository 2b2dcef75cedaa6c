"""Lines the serving-engine tests add to pytest's terminal summary (what was compared, costs)."""

from __future__ import annotations

REPORT: list[str] = []
