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
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from sample_conversations import keep  # noqa: E402

from lpc.integrations.access_runtime import AccessRuntime  # noqa: E402
from lpc.integrations.config import PluginConfig  # noqa: E402
from lpc.integrations.stats import PluginStats  # noqa: E402
from lpc.traces.load import TraceOptions, load_trace  # noqa: E402


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


def time_releases(
    model: Path, releases: list[tuple[ReleasingRequest, str, float]], repeats: int, tokens: bool
) -> list[float]:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=REPO / "models" / "mooncake-access")
    parser.add_argument("--one-in", type=int, default=40, help="keep one conversation in N")
    parser.add_argument("--repeats", type=int, default=5, help="replays of the sample")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    requests = [
        r
        for r in load_trace("mooncake", TraceOptions()).requests
        if keep(r.conversation_id, args.one_in)
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
    result: dict[str, Any] = {
        "model": str(args.model),
        "requests": len(releases),
        "mean_prompt_tokens": round(
            statistics.mean(t.num_prompt_tokens for t in (r.turn for r in requests)), 1
        ),
        "repeats": args.repeats,
    }
    for label, tokens in (("with_shared_prefix", True), ("without_tokens", False)):
        seconds = sorted(time_releases(args.model, releases, args.repeats, tokens))
        result[label] = {
            "median_us": round(1e6 * statistics.median(seconds), 1),
            "p99_us": round(1e6 * seconds[int(0.99 * (len(seconds) - 1))], 1),
            "mean_us": round(1e6 * statistics.mean(seconds), 1),
        }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['requests']} releases x {args.repeats} "
            f"(mean prompt {result['mean_prompt_tokens']} tokens), model {args.model}"
        )
        for label in ("with_shared_prefix", "without_tokens"):
            r = result[label]
            print(
                f"{label:<20} median {r['median_us']} us, p99 {r['p99_us']} us, "
                f"mean {r['mean_us']} us"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
