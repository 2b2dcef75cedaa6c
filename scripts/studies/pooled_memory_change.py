"""What keeping `lpc-pooled`'s sharing memory by chain (or by block) instead of by content
changes in `lpc ab`'s hit ratios, paired.

    python scripts/studies/pooled_memory_change.py [--memory chains|blocks] [--replay-until S]
        [lpc ab's arguments] [--json]

Runs `lpc ab` with the given arguments twice in one process: once with `lpc-pooled`'s hash
memory (`memory="content"`, each content's last release, kept across evictions) and once with
`--memory` (default `chains`: one entry per release under its top hash; `blocks`: what each
block's own metadata says while it holds its content; `eviction/lpc_pooled.py`), the
registry's `lpc-pooled` built with one or the other in both tiers. For every policy (and
two-tier pair) and size it prints both token hit ratios and the change in hit tokens with its
paired 95 % bootstrap interval over the counted conversations (`ab_change.py`).
`--replay-until S` stops the replay at S seconds after the trace's first arrival (the training
part alone: `--split-at 884 --replay-until 1768`).
The rules that read it: docs/results.md, "`lpc-pooled`'s sharing memory kept by block" and
"... kept by chain".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
from collections.abc import Iterator

from ab_change import change_rows, replay, row_lines

import eviction.registry as registry
from eviction.lpc_pooled import MEMORIES, PooledLPCEvictor


@contextlib.contextmanager
def with_memory(memory: str) -> Iterator[None]:
    """The registry's `lpc-pooled` built with `memory` (in both tiers, unless a tier names
    its own)."""
    entry = registry.POLICIES["lpc-pooled"]
    registry.POLICIES["lpc-pooled"] = dataclasses.replace(
        entry, factory=functools.partial(PooledLPCEvictor, memory=memory)
    )
    try:
        yield
    finally:
        registry.POLICIES["lpc-pooled"] = entry


def main() -> int:
    argv = [a for a in sys.argv[1:] if a != "--json"]
    as_json = "--json" in sys.argv[1:]
    until_s = None
    memory = "chains"
    if "--memory" in argv:
        at = argv.index("--memory")
        memory = argv[at + 1] if at + 1 < len(argv) else ""
        if memory not in MEMORIES or memory == "content":
            print("pooled_memory_change: --memory must be chains or blocks", file=sys.stderr)
            return 2
        del argv[at : at + 2]
    if "--replay-until" in argv:
        at = argv.index("--replay-until")
        try:
            until_s = float(argv[at + 1])
        except (IndexError, ValueError):
            print("pooled_memory_change: --replay-until needs a number of seconds", file=sys.stderr)
            return 2
        del argv[at : at + 2]
    content = replay(argv, lambda: with_memory("content"), until_s)
    rows = change_rows(content, replay(argv, lambda: with_memory(memory), until_s))
    if as_json:
        print(
            json.dumps(
                {"lpc_ab_args": argv, "memory": memory, "replay_until_s": until_s, "rows": rows}
            )
        )
        return 0
    for line in row_lines(rows, "content", memory):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
