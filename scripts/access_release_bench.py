"""Time the vLLM plugin's in-process access-model prediction per release.

Replays whole conversations of a trace (one in --one-in of the bundled Mooncake trace by
default, as scripts/sample_conversations.py keeps them) through `AccessRuntime.predict_release`
in completion order, with request objects carrying what vLLM's `Request` carries at a release
(prompt token list, output tokens, arrival time, conversation id), and reports the time per
release: with the model's shared-prefix features (token ids converted and kept) and, for
comparison, with the same model told it needs no tokens.

    .venv/bin/python scripts/access_release_bench.py --repeats 5 --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lpc.benchmarks.trace_release_bench import run, summary_lines  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=REPO / "models" / "mooncake-access")
    parser.add_argument("--one-in", type=int, default=40, help="keep one conversation in N")
    parser.add_argument("--repeats", type=int, default=5, help="replays of the sample")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = run(args.model, args.one_in, args.repeats)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(summary_lines(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
