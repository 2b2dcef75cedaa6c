"""The vLLM plugin's in-process access-model prediction per release, on a trace's conversations.

Whole conversations of the bundled Mooncake trace (one in `one_in`, by the stable rule of
scripts/sample_conversations.py) go through `AccessRuntime.predict_release` in completion
order, as request objects carrying what vLLM's `Request` carries at a release (prompt token
list, output tokens, arrival time, conversation id): the time per release with the model's
shared-prefix features (token ids converted and kept) and, for comparison, with the same model
told it needs no tokens. `scripts/access_release_bench.py` is its command line; `lpc bench
release` times the whole release path on synthetic requests instead.
"""

from __future__ import annotations

import statistics
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lpc.integrations.access_runtime import AccessRuntime
from lpc.integrations.config import PluginConfig
from lpc.integrations.stats import PluginStats
from lpc.traces.load import TraceOptions, load_trace

LABELS = ("with_shared_prefix", "without_tokens")


@dataclass
class Params:
    extra_args: dict[str, Any] | None = None


@dataclass
class ReleasingRequest:
    """The attributes of vLLM's `Request` the plugin reads at a release."""

    request_id: str
    arrival_time: float
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: Params = field(default_factory=Params)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def is_finished(self) -> bool:
        return True


Release = tuple[ReleasingRequest, str, float]  # the request, its conversation, its completion


def kept(conversation_id: str, one_in: int) -> bool:
    """scripts/sample_conversations.py's stable rule: crc32 of the id."""
    return zlib.crc32(conversation_id.encode("utf-8")) % one_in == 0


def sampled_releases(one_in: int) -> tuple[list[Release], float]:
    """The kept conversations' releases in completion order, and their mean prompt size."""
    requests = [
        r
        for r in load_trace("mooncake", TraceOptions()).requests
        if kept(r.conversation_id, one_in)
    ]
    releases = []
    for r in sorted(requests, key=lambda r: r.completion_s):
        t = r.turn
        prompt = list(t.token_ids[: t.num_prompt_tokens])
        output = list(t.token_ids[t.num_prompt_tokens :])
        releases.append(
            (
                ReleasingRequest(r.request_id, r.arrival_s, prompt, output),
                r.conversation_id,
                r.completion_s,
            )
        )
    mean_prompt = round(statistics.mean(r.turn.num_prompt_tokens for r in requests), 1)
    return releases, mean_prompt


def time_releases(model: Path, releases: list[Release], repeats: int, tokens: bool) -> list[float]:
    """Seconds per `predict_release`, every release `repeats` times, a fresh runtime each."""
    seconds = []
    for _ in range(repeats):
        runtime = AccessRuntime.load(PluginConfig(access_model=str(model)), PluginStats())
        if not tokens:  # the same model, its shared-prefix inputs left at 0
            runtime.model = replace(runtime.model, needs_tokens=False)
        for request, conversation, completion_s in releases:
            start = time.perf_counter()
            runtime.predict_release(
                request, conversation, completion_s, len(request.prompt_token_ids)
            )
            seconds.append(time.perf_counter() - start)
    return seconds


def run(model: Path, one_in: int, repeats: int) -> dict[str, Any]:
    """The figures: the sample, then median, p99 and mean µs per release for each label."""
    releases, mean_prompt = sampled_releases(one_in)
    result: dict[str, Any] = {
        "model": str(model),
        "requests": len(releases),
        "mean_prompt_tokens": mean_prompt,
        "repeats": repeats,
    }
    for label, tokens in zip(LABELS, (True, False), strict=True):
        seconds = sorted(time_releases(model, releases, repeats, tokens))
        result[label] = {
            "median_us": round(1e6 * statistics.median(seconds), 1),
            "p99_us": round(1e6 * seconds[int(0.99 * (len(seconds) - 1))], 1),
            "mean_us": round(1e6 * statistics.mean(seconds), 1),
        }
    return result


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The figures as text: the sample, then a line per label."""
    lines = [
        f"{result['requests']} releases x {result['repeats']} "
        f"(mean prompt {result['mean_prompt_tokens']} tokens), model {result['model']}"
    ]
    for label in LABELS:
        r = result[label]
        lines.append(
            f"{label:<20} median {r['median_us']} us, p99 {r['p99_us']} us, mean {r['mean_us']} us"
        )
    return lines
