"""What prefix closure changed: `lpc ab`'s hit ratios with the leaves-first heap against the
same replay with the keys' order alone (today's figures before the change), paired.

    python scripts/studies/prefix_closure_change.py [lpc ab's arguments] [--json]

Runs `lpc ab` with the given arguments twice in one process: once as the code stands and once
with the run heap's chain links switched off (`RunHeap._link_runs` a no-op), which is the order
before prefix closure, bit for bit: with no link no block is ever held back. For every learned
policy and cache size it prints both token hit ratios and the change with its paired 95 %
bootstrap interval over the evaluation part's conversations (`ab_change.py`).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator

from ab_change import change_rows, replay, row_lines

from eviction.run_heap import RunHeap


@contextlib.contextmanager
def without_links() -> Iterator[None]:
    """The run heap with its chain links off: the keys' order alone."""
    link = RunHeap._link_runs
    RunHeap._link_runs = lambda self, runs, parent_id: None
    try:
        yield
    finally:
        RunHeap._link_runs = link


def main() -> int:
    argv = [a for a in sys.argv[1:] if a != "--json"]
    rows = change_rows(replay(argv, without_links), replay(argv))
    if "--json" in sys.argv[1:]:
        print(json.dumps({"lpc_ab_args": argv, "rows": rows}))
        return 0
    for line in row_lines(rows, "before", "after"):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
