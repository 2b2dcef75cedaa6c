"""Write tests/golden/expected.json from the current code: run ONCE when a change of hits is
intended and explained (the commit says why), never to make a failing golden test pass.

    .venv/bin/python -m tests.golden.regenerate [--case NAME ...] [--json]

Each case is replayed in a temporary folder (its token cache too); the file is written
atomically (a temporary file, then a rename), keeping the cases not asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from tests.golden.cases import CASES, EXPECTED, Table


def compute(name: str) -> Table:
    """One case's table, replayed in a fresh folder with its own token cache."""
    case = next(c for c in CASES if c.name == name)
    with tempfile.TemporaryDirectory(prefix=f"golden-{name}-") as folder:
        previous = os.environ.get("LPC_CACHE_DIR")
        os.environ["LPC_CACHE_DIR"] = str(Path(folder) / "cache")
        try:
            return case.compute(Path(folder))
        finally:
            if previous is None:
                del os.environ["LPC_CACHE_DIR"]
            else:
                os.environ["LPC_CACHE_DIR"] = previous


def write_atomically(path: Path, tables: dict[str, Table]) -> None:
    text = json.dumps(tables, indent=1, sort_keys=True) + "\n"
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False
    ) as handle:
        handle.write(text)
    os.replace(handle.name, path)


def main(argv: list[str] | None = None) -> int:
    names = [c.name for c in CASES]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=names, help="default: every case")
    parser.add_argument("--json", action="store_true", help="print the new tables as JSON")
    args = parser.parse_args(argv)
    tables: dict[str, Table] = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
    for name in args.case or names:
        print(f"golden: replaying {name} ...", file=sys.stderr, flush=True)
        tables[name] = compute(name)
    write_atomically(EXPECTED, tables)
    if args.json:
        print(json.dumps({n: tables[n] for n in args.case or names}, indent=1, sort_keys=True))
    else:
        print(f"golden: wrote {len(tables)} cases to {EXPECTED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
