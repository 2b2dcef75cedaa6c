"""Replay a request stream through SGLang 0.5.23's real radix cache (runs in .sglang-venv).

The driver half of scripts/sglang_trace_ab.py, which prepares the stream in the project's
venv and runs this file with SGLang's python:

    .sglang-venv/bin/python scripts/sglang_radix_replay.py STREAM.json OUT.json

STREAM.json: {"capacity_tokens", "kind" ("unified" or "radix"), "policies": [[label,
policy, config, clock ("trace": each event's time; "sglang": UnifiedRadixCache's own tick
counter)]], "requests": [{"tokens", "prompt_len", "priority", "cache_salt"}], "events": [[time_s,
kind (0 completion, 1 arrival), request index]]}. For each policy a fresh cache of
`capacity_tokens` KV slots replays the events with `lpc.drivers.sglang_radix`
(SGLang's own match, insert, lock and evict; the clock set to each event's time); OUT.json
gets each policy's counters, with `ticks`: how far UnifiedRadixCache's own access counter
advanced (the time unit of a served unified tree; it stays put on the trace clock). The LPC
strategy is registered into SGLang by calling the plugin's entry point, `register()`, as
SGLang's loader does with SGLANG_PLUGINS=lpc.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lpc.drivers.sglang_radix import FakeClock, RealRadixCache
from lpc.integrations.sglang_strategy import register

ARRIVAL = 1


def replay(stream: dict, policy: str, config: dict | None, clock_name: str) -> dict:
    started = time.perf_counter()
    clock = FakeClock()
    ticks = importlib.import_module("sglang.srt.mem_cache.unified_cache.components.base")
    ticks_before = ticks.get_and_increase_time_counter()
    requests = stream["requests"]
    held: dict[int, object] = {}
    with RealRadixCache(
        stream["kind"],
        stream["capacity_tokens"],
        policy,
        config,
        clock,
        sglang_clock=clock_name == "sglang",
    ) as cache:
        free_at_start = cache.available_slots()
        for time_s, kind, i in stream["events"]:
            clock.now = time_s
            request = requests[i]
            if kind == ARRIVAL:
                h = cache.arrive(
                    request["tokens"],
                    request["prompt_len"],
                    request["priority"],
                    request.get("cache_salt"),
                )
                if h is not None:
                    held[i] = h
            elif i in held:
                cache.complete(held.pop(i))  # type: ignore[arg-type]
        assert not held, f"{len(held)} requests never completed"
        counters = asdict(cache.counters)
        counters["cached_tokens_at_end"] = cache.evictable_tokens()
        counters["slots_accounted"] = (
            cache.available_slots() + cache.evictable_tokens() == free_at_start
        )
        counters["strategy"] = type(cache.strategy).__name__
        counters["cache"] = type(cache.cache).__name__
    counters["ticks"] = ticks.get_and_increase_time_counter() - ticks_before - 1
    counters["seconds"] = round(time.perf_counter() - started, 2)
    return counters


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: sglang_radix_replay.py STREAM.json OUT.json", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    register()
    stream = json.loads(Path(argv[0]).read_text())
    out = {
        label: replay(stream, policy, config, clock)
        for label, policy, config, clock in stream["policies"]
    }
    Path(argv[1]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
