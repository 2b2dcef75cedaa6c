"""What a hit in each tier costs in time: the two-tier replay's latency model.

A GPU (device) hit is free: its KV is already where attention reads it. A CPU (host) hit costs
a host→device copy of the block's KV over PCIe. A miss costs a prefill on the GPU, after the
hit prefix. The time to first token of a request of k hit (cached) and n missed tokens is

    ttft = overhead + n / prefill speed + pair cost · ((k + n)² − k²)
           + host-hit tokens · KV bytes per token / host→device bandwidth

one request on its own: no batching with other requests and no queueing behind them (the
trace's timeline is fixed, so waiting for the GPU is not modelled), and copies do not overlap
the prefill (vLLM's `OffloadingConnector` loads a request's hit before it is scheduled). The
prefill term is the causal prefill's time T(L) = L / speed + pair cost · L² of the whole
prompt less that of the cached prefix: the projections and MLP cost per token, attention per
pair of tokens, so a token costs more the longer the context it attends to.

Defaults are those of Qwen3-8B on one H100 SXM (`QWEN3_8B`), every figure overridable:
- KV bytes per token = 2 (K and V) × 36 layers × 8 KV heads × 128 head dim × 2 bytes
  (bfloat16) = 147,456 B; from Qwen3-8B's `config.json` on the Hugging Face Hub
  (`num_hidden_layers` 36, `num_key_value_heads` 8, `head_dim` 128, `torch_dtype` bfloat16).
- host→device bandwidth 30 GB/s: measured on one H100 80GB HBM3 (PCIe Gen5 x16), 10,240
  tokens of KV in 46,080 pages of 32 KB (one layer's K or V of a 16-token block) from
  scattered pinned host pages, all in one `cuMemcpyBatchAsync` call as vLLM's CPU tier copies
  pages of 28 KB and more: 30.8 GB/s at best, rounded (34.0 in a later run; one bulk copy:
  54–55 GB/s).
- prefill 33,000 tokens/s and 0.51 ns per token pair: T(L) fitted on prefills of 2,048 to
  131,072 tokens measured on that GPU (`transformers`' Qwen3 with Qwen3-8B's shape, random
  bfloat16 weights, `sdpa` attention; max error 1.8 %), rounded. 8,192 tokens then take
  0.28 s (29,000 tokens/s), 131,072 take 12.8 s (10,200 tokens/s). In `transformers` a
  prefill after a cached prefix took 20–107 % longer than the model's difference of the two
  prefills; an engine's paged attention is built to avoid that cost, but its own suffix
  timings are not measured (docs/results.md).
- overhead 20 ms: scheduling and the forward pass that samples the first token (not measured).

`scripts/measure_tier_latency.py` measures these figures on any CUDA GPU; docs/results.md
("Two tiers", "The latency model, measured") has the runs.
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
    """Seconds per missed token and token pair, per host-hit token and per request (the
    module's docstring)."""

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
