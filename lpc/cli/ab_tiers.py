"""`lpc ab`'s two-tier flags: a CPU offload tier below the GPU prefix cache, its policies,
its store threshold and the latency model that turns each tier's hits into time."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import replace

from lpc.cli.arg_types import non_negative_int, positive_float
from lpc.replay.latency import QWEN3_8B, TierLatency

_DEFAULTS = TierLatency()


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def add_tier_arguments(
    parser: argparse.ArgumentParser, sizes: Callable[[str], tuple[int, ...]]
) -> None:
    group = parser.add_argument_group(
        "two tiers (a CPU offload tier below the GPU cache, vLLM's OffloadingConnector)"
    )
    group.add_argument(
        "--offload-sizes",
        type=sizes,
        default=None,
        help="CPU tier sizes in tokens (8M,16M,32M); each is replayed below every "
        "--cache-sizes GPU size. Without it nothing changes",
    )
    group.add_argument(
        "--offload-policies",
        default="lru",
        help="the CPU tier's policies, any --policies name, or vllm-arc: vLLM's own ARC for "
        "this tier, run as its CPUOffloadingManager runs it (arc is FAST'03 ARC) (default: "
        "%(default)s); every pair with --policies replays the one identical trace",
    )
    group.add_argument(
        "--offload-store-threshold",
        type=non_negative_int,
        default=0,
        help="store a block in the CPU tier only once it was offered this many times "
        "(vLLM's store_threshold; 0 or 1: always; default: %(default)s)",
    )
    group.add_argument(
        "--kv-bytes-per-token",
        type=positive_float,
        default=_DEFAULTS.kv_bytes_per_token,
        help=f"KV cache bytes per token (default: {QWEN3_8B.name}'s "
        f"{QWEN3_8B.bytes_per_token:,}: 2 × {QWEN3_8B.num_layers} layers × "
        f"{QWEN3_8B.num_kv_heads} KV heads × {QWEN3_8B.head_dim} × {QWEN3_8B.dtype_bytes} B)",
    )
    group.add_argument(
        "--host-to-device-gbps",
        type=positive_float,
        default=_DEFAULTS.host_to_device_bytes_per_s / 1e9,
        help="host→device copy bandwidth in GB/s (default: %(default)s, vLLM's paged copy "
        "measured on one H100, PCIe Gen5 x16)",
    )
    group.add_argument(
        "--ttft-prefill-tokens-per-s",
        type=positive_float,
        default=_DEFAULTS.prefill_tokens_per_s,
        help="prefill speed of the TTFT model, its per-token part (default: %(default)s, "
        "Qwen3-8B measured on one H100)",
    )
    group.add_argument(
        "--ttft-prefill-ns-per-token-pair",
        type=_non_negative_float,
        default=_DEFAULTS.prefill_s_per_token_pair * 1e9,
        help="prefill's attention part: ns per pair of a token and one it attends to "
        "(default: %(default)s, Qwen3-8B measured on one H100; 0: a prefill's speed does not "
        "depend on the context)",
    )
    group.add_argument(
        "--ttft-overhead-s",
        type=_non_negative_float,
        default=_DEFAULTS.overhead_s,
        help="fixed TTFT per request: scheduling and the first token's step (default: %(default)s)",
    )


def tier_settings_from(args: argparse.Namespace):
    """The two-tier settings of the parsed flags, or None without --offload-sizes."""
    from lpc.errors import CommandError, InvalidInputError
    from lpc.replay.policies import parse_policies
    from lpc.replay.two_tier import TierSettings

    if args.offload_sizes is None:
        return None
    try:
        policies = tuple(parse_policies(args.offload_policies, cpu_tier=True))
    except InvalidInputError as error:
        raise CommandError(f"--offload-policies: {error}") from None
    latency = TierLatency(
        kv_bytes_per_token=args.kv_bytes_per_token,
        host_to_device_bytes_per_s=args.host_to_device_gbps * 1e9,
        prefill_tokens_per_s=args.ttft_prefill_tokens_per_s,
        prefill_s_per_token_pair=args.ttft_prefill_ns_per_token_pair * 1e-9,
        overhead_s=args.ttft_overhead_s,
    )
    if latency != _DEFAULTS:  # the figures are no longer those of the named model
        latency = replace(latency, model=f"{_DEFAULTS.model}, figures overridden by flags")
    return TierSettings(args.offload_sizes, policies, args.offload_store_threshold, latency)
