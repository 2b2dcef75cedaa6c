"""`lpc serve`: run the batched prediction RPC for a trained predictor artifact."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from lpc.cli import extras
from training.locations import SHIPPED_MODEL_NAME, shipped_model_dir

ARTIFACT_ENV = "LPC_PREDICTOR_ARTIFACT"


def artifact_from(args: argparse.Namespace) -> Path | None:
    """--artifact, else $LPC_PREDICTOR_ARTIFACT, else the shipped model when present: with no
    flag, a checkout serves the model committed with the code."""
    if args.artifact is not None:
        return args.artifact
    configured = os.environ.get(ARTIFACT_ENV, "").strip()
    if configured:
        return Path(configured)
    return shipped_model_dir()


def register(subparsers: argparse._SubParsersAction) -> None:
    from predictor.access_features import computable_on  # the help lists what can be served

    parser = subparsers.add_parser(
        "serve",
        help="serve continuation predictions over HTTP (batched, for inference engines)",
        description=(
            "Serves POST /v1/predict (batched windows, or access features for an access-only "
            "model, in; probabilities out), POST /v1/reload "
            "(swap in a promoted artifact without dropping requests), GET /healthz and GET "
            "/metrics (Prometheus). Requests from concurrent callers are micro-batched; past "
            "the queue bound the server answers 503 so callers fall back at once. SIGINT or "
            "SIGTERM stops accepting, finishes requests in flight, then exits. "
            "See docs/predictor.md."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_model_args(parser, computable_on("window"))
    _add_limit_args(parser)
    _add_runtime_args(parser)
    parser.set_defaults(run=run)


def _add_model_args(parser: argparse.ArgumentParser, request_features: tuple[str, ...]) -> None:
    """What is served: the artifact, its embedder and device."""
    parser.add_argument(
        "--artifact",
        "--model",
        dest="artifact",
        type=Path,
        default=None,
        help=f"predictor artifact folder (--model is the same flag); without it, ${ARTIFACT_ENV}, "
        f"else the shipped model models/{SHIPPED_MODEL_NAME} if present. "
        "A model trained with the opt-in log_prompt_tokens feature (not the shipped one) "
        "needs prompt_tokens in every item; a text model may read only the features a request "
        f"carries ({', '.join(request_features)}), any other is refused at start. "
        "An access-only model (lpc train --trace, lpc retrain --logs) is served without an "
        "embedder: its items carry access_features",
    )
    parser.add_argument(
        "--embedder",
        default=None,
        help="embedder spec; default: the one the artifact was trained with",
    )
    parser.add_argument("--device", default=None, help="torch device (default: GPU if any)")


def _add_limit_args(parser: argparse.ArgumentParser) -> None:
    """Where it listens, and the bounds on batches, queues, bodies and time."""
    parser.add_argument(
        "--host", default="127.0.0.1", help="bind address; keep loopback unless a token is set"
    )
    parser.add_argument("--port", type=int, default=8476, help="TCP port")
    parser.add_argument("--max-batch", type=int, default=32, help="windows per model batch")
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=0.0,
        help="how long a batch is held open to gather more windows; 0 "
        "dispatches as soon as the model is free (requests arriving "
        "while a batch runs form the next one); >0 helps on a GPU",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=256,
        help="windows allowed to wait; beyond it requests get 503",
    )
    parser.add_argument(
        "--max-items-per-request", type=int, default=64, help="windows per request (422 beyond)"
    )
    parser.add_argument(
        "--max-prompt-chars",
        type=int,
        default=65536,
        help="characters per user prompt (422 beyond)",
    )
    parser.add_argument(
        "--max-prompts-per-item",
        type=int,
        default=64,
        help="user prompts per window (422 beyond; only the last N+1 are used)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=16 * 1024 * 1024,
        help="request body size limit, checked before parsing (413 beyond)",
    )
    parser.add_argument(
        "--request-timeout-s", type=float, default=30.0, help="a request waiting longer gets 504"
    )
    parser.add_argument(
        "--graceful-timeout-s",
        type=float,
        default=30.0,
        help="on shutdown, how long requests in flight may take to finish",
    )


def _add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """The embedder's batching and threads, authentication, reload root and logging."""
    parser.add_argument(
        "--embed-batch-size",
        type=int,
        default=8,
        help="texts per embedder forward pass (8 suits a CPU; raise on a GPU)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's choice, one per core); "
        "1 can be faster on a machine shared with other busy processes",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="file holding a bearer token required on /v1/* "
        "(default: $LPC_PREDICTOR_TOKEN, else no auth)",
    )
    parser.add_argument(
        "--model-root",
        type=Path,
        default=None,
        help="reloads may load artifacts only under this folder (default: the artifact's parent)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn log level",
    )


def run(args: argparse.Namespace) -> int:
    import sys

    extras.require("serve")

    from predictor.runtime import prefer_passive_openmp

    prefer_passive_openmp()  # before torch is imported: see predictor/runtime.py

    from lpc.errors import CommandError
    from predictor.server import create_app, uvicorn_server

    artifact_path = artifact_from(args)
    if artifact_path is None:
        raise CommandError(
            f"no artifact: pass --artifact or set ${ARTIFACT_ENV} (the shipped "
            f"model models/{SHIPPED_MODEL_NAME} is not in this checkout)"
        )
    if args.embed_batch_size < 1:
        raise CommandError(f"--embed-batch-size must be >= 1, got {args.embed_batch_size}")
    if args.threads is not None:
        if args.threads < 1:
            raise CommandError(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    config = server_config_from(args)
    if args.host not in ("127.0.0.1", "localhost", "::1") and config.token is None:
        print(f"lpc serve: warning: listening on {args.host} without a token", file=sys.stderr)
    predictor, serving = served_predictor(args, artifact_path)
    app = create_app(config, predictor, artifact_path=artifact_path)
    print(
        f"lpc serve: {serving} on http://{config.host}:{config.port}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn_server(app, config, log_level=args.log_level).run()
    return 0


def server_config_from(args: argparse.Namespace):
    """The server's `ServerConfig` (limits, timers, token) from the flags; a bad value is a
    `CommandError` naming the field, an unreadable token file a `UserError`."""
    from lpc.errors import CommandError, InvalidInputError
    from predictor.bearer_token import read_bearer_token
    from predictor.rpc_schema import RequestLimits
    from predictor.server import ServerConfig

    token = read_bearer_token(args.token_file, "--token-file")  # UserError when unreadable
    try:
        limits = RequestLimits(
            max_items_per_request=args.max_items_per_request,
            max_prompts_per_item=args.max_prompts_per_item,
            max_prompt_chars=args.max_prompt_chars,
            max_body_bytes=args.max_body_bytes,
        )
        return ServerConfig(
            host=args.host,
            port=args.port,
            max_batch=args.max_batch,
            max_wait_ms=args.max_wait_ms,
            max_queue_items=args.max_queue,
            request_timeout_s=args.request_timeout_s,
            graceful_timeout_s=args.graceful_timeout_s,
            token=token,
            limits=limits,
            model_root=args.model_root,
        )
    except InvalidInputError as error:  # RequestLimits and ServerConfig name the bad field
        raise CommandError(str(error)) from None


def served_predictor(args: argparse.Namespace, artifact_path: Path):
    """The model to serve and a line saying what it is: an access-only model as it is, a
    text predictor over its embedder. Artifact, servability and embedder problems are
    `UserError`s: one line from the CLI."""
    from predictor.access_features import check_servable
    from predictor.artifact import load_artifact
    from predictor.embedders import load_embedder
    from predictor.predictor import Predictor
    from predictor.server import load_served_model

    access_model = load_served_model(artifact_path)  # an access-only model: no embedder
    if access_model is not None:
        features = ", ".join(access_model.feature_names)
        return access_model, f"access-only model {artifact_path} (features: {features})"
    artifact = load_artifact(artifact_path)
    # Before the embedder loads: an unservable model is refused at once.
    check_servable(artifact.metadata.mlp_config.extra_features, f"artifact {artifact_path}")
    spec = args.embedder or artifact.metadata.embedder_spec
    embedder = load_embedder(spec, device=args.device)
    predictor = Predictor(artifact, embedder, embed_batch_size=args.embed_batch_size)
    return predictor, f"{embedder.embedder_id} + {artifact_path}"
