"""What a hit in each tier costs in time: the two-tier replay's latency model.

A GPU (device) hit is free: its KV is already where attention reads it. A CPU (host) hit costs
a host→device copy of the block's KV over PCIe. A miss costs a prefill on the GPU. The time to
first token of a request is modelled as

    ttft = overhead + missed tokens / prefill speed + host-hit tokens · KV bytes per token
           / host→device bandwidth

one request on its own: no batching with other requests and no queueing behind them (the
trace's timeline is fixed, so waiting for the GPU is not modelled), and copies do not overlap
the prefill (vLLM's `OffloadingConnector` loads a request's hit before it is scheduled).

Defaults are those of Qwen3-8B on one H100 SXM (`QWEN3_8B`), every figure overridable:
- KV bytes per token = 2 (K and V) × 36 layers × 8 KV heads × 128 head dim × 2 bytes
  (bfloat16) = 147,456 B; from Qwen3-8B's `config.json` on the Hugging Face Hub
  (`num_hidden_layers` 36, `num_key_value_heads` 8, `head_dim` 128, `torch_dtype` bfloat16).
- host→device bandwidth 25 GB/s: an assumption, about 40 % of PCIe Gen5 x16's 64 GB/s per
  direction, for vLLM's block-wise copies from pinned host memory.
- prefill 20,000 tokens/s: an assumption; 8.2 B parameters need ≈ 16.4 GFLOP per token, and
  an H100's 989 dense BF16 TFLOP/s at ≈ 33 % utilisation gives ≈ 20K tokens/s. Attention's
  growth with the context length is ignored.
- overhead 20 ms: scheduling and the forward pass that samples the first token.
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
    """Seconds per missed token, per host-hit token and per request (see the module)."""

    kv_bytes_per_token: float = float(QWEN3_8B.bytes_per_token)
    host_to_device_bytes_per_s: float = 25e9
    prefill_tokens_per_s: float = 20_000.0
    overhead_s: float = 0.02
    model: str = f"{QWEN3_8B.name} on one H100 SXM"

    def __post_init__(self) -> None:
        for name in ("kv_bytes_per_token", "host_to_device_bytes_per_s", "prefill_tokens_per_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise InvalidInputError(
                    f"latency model: {name} must be finite and > 0, got {value!r}"
                )
        if not math.isfinite(self.overhead_s) or self.overhead_s < 0:
            raise InvalidInputError(
                f"latency model: overhead_s must be finite and >= 0, got {self.overhead_s!r}"
            )

    @property
    def load_s_per_token(self) -> float:
        """Seconds to copy one token's KV from host to device."""
        return self.kv_bytes_per_token / self.host_to_device_bytes_per_s

    def ttft_s(self, missed_tokens: np.ndarray, host_hit_tokens: np.ndarray) -> np.ndarray:
        """Time to first token of each request, from its missed and host-hit token counts."""
        return (
            self.overhead_s
            + missed_tokens / self.prefill_tokens_per_s
            + host_hit_tokens * self.load_s_per_token
        )

    def prefill_s(self, tokens: int) -> float:
        """GPU seconds a prefill of `tokens` tokens takes (what a hit of them saves)."""
        return tokens / self.prefill_tokens_per_s

    def offload_gib(self, tokens: int) -> float:
        """Host memory a CPU tier of `tokens` tokens needs, in GiB."""
        return tokens * self.kv_bytes_per_token / 2**30

    def to_dict(self) -> dict[str, float | str]:
        return {
            "model": self.model,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "host_to_device_bytes_per_s": self.host_to_device_bytes_per_s,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
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
    """Percentiles of the per-request TTFT; prefill GPU-seconds saved counts every hit token
    (device or host) as prefill the GPU did not run; `load_s` is the copies' total time."""
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
    ttft = latency.ttft_s(missed, host)
    saved = float(device.sum() + host.sum())
    return TTFTSummary(
        p50_s=float(np.percentile(ttft, 50)),
        p90_s=float(np.percentile(ttft, 90)),
        mean_s=float(ttft.mean()),
        prefill_gpu_s_saved=latency.prefill_s(int(saved)),
        load_s=float(host.sum() * latency.load_s_per_token),
    )
