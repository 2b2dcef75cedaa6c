"""Keep one conversation in N of a project-format trace (docs/traces.md), whole.

A replay that materialises every token (SGLang's token-granular radix tree) cannot take the
whole Mooncake trace (145M prompt tokens), and a slice in time would cut conversations and
their think times. Sampling whole conversations keeps the trace's hour, its arrival pattern
and every conversation's turns; a stable hash (crc32 of the id) makes the sample the same on
every machine.

    .venv/bin/python scripts/sample_conversations.py full.jsonl sample.jsonl --one-in 8
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path


def keep(conversation_id: str, one_in: int) -> bool:
    return zlib.crc32(conversation_id.encode("utf-8")) % one_in == 0


def sample(source: Path, target: Path, one_in: int) -> tuple[int, int]:
    """Copy the header and the kept conversations' lines; (kept, total) request lines."""
    kept = total = 0
    with source.open(encoding="utf-8") as lines, target.open("w", encoding="utf-8") as out:
        for lineno, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{source}:{lineno}: not JSON ({error.msg})") from None
            if "conversation_id" not in record:
                if lineno == 1:  # the header
                    out.write(line)
                    continue
                raise ValueError(f"{source}:{lineno}: no 'conversation_id'")
            total += 1
            if keep(str(record["conversation_id"]), one_in):
                out.write(line)
                kept += 1
    return kept, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="trace in the project's format")
    parser.add_argument("target", type=Path, help="where to write the sample")
    parser.add_argument("--one-in", type=int, default=8, help="keep one conversation in N")
    args = parser.parse_args(argv)
    if args.one_in < 1:
        parser.error(f"--one-in must be >= 1, got {args.one_in}")
    if not args.source.is_file():
        parser.error(f"{args.source}: no such file")
    try:
        kept, total = sample(args.source, args.target, args.one_in)
    except ValueError as error:
        print(f"sample_conversations: error: {error}", file=sys.stderr)
        return 2
    print(f"kept {kept} of {total} requests (one conversation in {args.one_in})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
