"""What a hit in each tier costs in time: the two-tier replay's latency model.

A GPU hit is free, a CPU hit costs a host→device copy of its KV, and a miss costs a causal
prefill after the hit prefix: ttft = overhead + n / prefill speed + pair cost · ((k + n)² − k²)
+ host-hit tokens · KV bytes per token / host→device bandwidth, one request on its own.
Defaults are Qwen3-8B on one H100 SXM (`QWEN3_8B`), every figure overridable.

Where each default comes from: docs/design.md, "Two tiers" and "The latency model's figures";
the runs: docs/results.md, "The latency model, measured".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lpc.errors import InvalidInputError


@dataclass(frozen=True)
class KVShape:
    """The figures of a model's config that fix its KV cache's bytes per token."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


QWEN3_8B = KVShape("Qwen3-8B", num_layers=36, num_kv_heads=8, head_dim=128, dtype_bytes=2)


@dataclass(frozen=True)
class TierLatency:
    """Seconds per missed token and token pair, per host-hit token and per request
    (docs/design.md, "The latency model's figures")."""

    kv_bytes_per_token: float = float(QWEN3_8B.bytes_per_token)
    host_to_device_bytes_per_s: float = 30e9
    prefill_tokens_per_s: float = 33_000.0
    prefill_s_per_token_pair: float = 0.51e-9
    overhead_s: float = 0.02
    model: str = f"{QWEN3_8B.name} on one H100 SXM (measured)"

    def __post_init__(self) -> None:
        for name in ("kv_bytes_per_token", "host_to_device_bytes_per_s", "prefill_tokens_per_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise InvalidInputError(
                    f"latency model: {name} must be finite and > 0, got {value!r}"
                )
        for name in ("prefill_s_per_token_pair", "overhead_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidInputError(
                    f"latency model: {name} must be finite and >= 0, got {value!r}"
                )

    @property
    def load_s_per_token(self) -> float:
        """Seconds to copy one token's KV from host to device."""
        return self.kv_bytes_per_token / self.host_to_device_bytes_per_s

    def prefill_s(self, tokens: np.ndarray | float) -> np.ndarray | float:
        """GPU seconds a prefill of `tokens` tokens with nothing cached takes (no overhead):
        what a hit of those tokens saves."""
        return tokens / self.prefill_tokens_per_s + self.prefill_s_per_token_pair * tokens**2

    def suffix_prefill_s(self, cached_tokens: np.ndarray, new_tokens: np.ndarray) -> np.ndarray:
        """GPU seconds a prefill of `new_tokens` after `cached_tokens` cached ones takes."""
        total = cached_tokens + new_tokens
        return new_tokens / self.prefill_tokens_per_s + self.prefill_s_per_token_pair * (
            total**2 - cached_tokens**2
        )

    def ttft_s(
        self, missed_tokens: np.ndarray, host_hit_tokens: np.ndarray, cached_tokens: np.ndarray
    ) -> np.ndarray:
        """Time to first token of each request, from its missed and host-hit token counts and
        its cached prefix (device and host hits together)."""
        return (
            self.overhead_s
            + self.suffix_prefill_s(cached_tokens, missed_tokens)
            + host_hit_tokens * self.load_s_per_token
        )

    def offload_gib(self, tokens: int) -> float:
        """Host memory a CPU tier of `tokens` tokens needs, in GiB."""
        return tokens * self.kv_bytes_per_token / 2**30

    def to_dict(self) -> dict[str, float | str]:
        return {
            "model": self.model,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "host_to_device_bytes_per_s": self.host_to_device_bytes_per_s,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "prefill_s_per_token_pair": self.prefill_s_per_token_pair,
            "overhead_s": self.overhead_s,
        }


@dataclass(frozen=True)
class TTFTSummary:
    """TTFT percentiles over a replay's counted requests, and the prefill time hits saved."""

    p50_s: float
    p90_s: float
    mean_s: float
    prefill_gpu_s_saved: float
    load_s: float


def summarise_ttft(
    latency: TierLatency,
    prompt_tokens: Sequence[int],
    device_hit_tokens: Sequence[int],
    host_hit_tokens: Sequence[int],
) -> TTFTSummary:
    """Percentiles of the per-request TTFT; prefill GPU-seconds saved is, per request, the
    prefill of its cached prefix (device and host hits), which the GPU did not run; `load_s`
    is the copies' total time."""
    prompt = np.asarray(prompt_tokens, dtype=np.float64)
    device = np.asarray(device_hit_tokens, dtype=np.float64)
    host = np.asarray(host_hit_tokens, dtype=np.float64)
    if not (len(prompt) == len(device) == len(host)):
        raise ValueError(
            f"one count per request: {len(prompt)} prompts, {len(device)} device hits, "
            f"{len(host)} host hits"
        )
    if len(prompt) == 0:
        return TTFTSummary(0.0, 0.0, 0.0, 0.0, 0.0)
    missed = prompt - device - host
    if (missed < 0).any():
        raise ValueError("a request has more hit tokens than prompt tokens")
    cached = device + host
    ttft = latency.ttft_s(missed, host, cached)
    return TTFTSummary(
        p50_s=float(np.percentile(ttft, 50)),
        p90_s=float(np.percentile(ttft, 90)),
        mean_s=float(ttft.mean()),
        prefill_gpu_s_saved=float(np.sum(latency.prefill_s(cached))),
        load_s=float(host.sum() * latency.load_s_per_token),
    )
