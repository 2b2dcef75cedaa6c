"""Replay operation streams on real vLLM 0.33.0, stock and with the LPC plugin, step by step.

Runs INSIDE the vLLM venv. It extends `scripts/vllm_replay.py` (the differential test's
driver, whose `VllmReplay` it reuses unchanged) with what LPC needs: each request carries the
probability and conversation id of a `ReleasePlan` in `SamplingParams.extra_args`, as an API
layer would send them, and the plugin's clock reads the plan's time of the current step.

In one process (importing vLLM costs ~10 s) it replays every stream on stock vLLM first, if
`--stock-output` is given, then registers LPC's runtime without patching anything
(`vllm_plugin.install_runtime`) and replays them again, if `--plugin-output` is given: each
manager's pool gets the LPC queue and each free goes through the LPC scheduler class's free
path (`SchedulerLPC.free`: the release announced, then vLLM's `KVCacheManager.free`), and a
request's first allocation tells what its first scheduling tells the class
(`SchedulerLPC.admitted`). Records are `lpc.difftest.ops.StepRecord`
JSON lines; with `--outcomes-only` the free queue and cached set are left empty (long traces).
The last line on stderr is a JSON summary: versions, timings and the plugin's counters.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import vllm_replay  # noqa: E402  (scripts/vllm_replay.py, the differential test's driver)

from lpc.difftest.ops import (  # noqa: E402
    FreeRequest,
    NewRequest,
    StepRecord,
    Stream,
    read_streams,
)
from lpc.drivers.release_plan import (  # noqa: E402
    PluginSettings,
    ReleasePlan,
    read_plans,
)


class StepClock:
    """The plugin's clock: the plan's time of the step being replayed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class PlannedReplay(vllm_replay.VllmReplay):
    """`VllmReplay` whose requests carry their plan's LPC fields, on the plan's clock."""

    def __init__(
        self,
        vllm: Any,
        stream: Stream,
        plan: ReleasePlan,
        clock: StepClock,
        outcomes_only: bool,
        before_free: Callable[[], None] | None = None,
        plugin: Any = None,
    ) -> None:
        self._plan = plan
        self._clock = clock
        self._outcomes_only = outcomes_only
        self._before_free = before_free
        self._current: NewRequest | None = None
        real = vllm.SamplingParams

        def sampling_params(**kwargs: Any) -> Any:
            # VllmReplay builds SamplingParams(max_tokens=...) for the op being replayed.
            assert self._current is not None
            extra = plan.request(self._current.request_id).extra_args()
            return real(**kwargs, extra_args=extra or None)

        real_request = vllm.Request

        def request(**kwargs: Any) -> Any:
            # Arrivals on the plan's clock, like releases: a request log is on one timeline.
            return real_request(**{**kwargs, "arrival_time": clock.now})

        namespace = types.SimpleNamespace(**vars(vllm))
        namespace.SamplingParams = sampling_params
        namespace.Request = request
        super().__init__(namespace, stream.config)
        self._lpc: Any = None
        if plugin is not None:  # this manager's pool gets the LPC queue, as the class gives it
            from lpc.integrations.scheduler_lpc import attach_manager

            self._lpc = attach_manager(self.manager, plugin)

    def _new(self, step: int, op: NewRequest) -> StepRecord:
        self._clock.now = self._plan.time_of(step)
        self._current = op
        try:
            return super()._new(step, op)
        finally:
            self._current = None

    def _free(self, step: int, op: FreeRequest) -> StepRecord:
        self._clock.now = self._plan.time_of(step)
        if self._before_free is not None:
            self._before_free()
        return super()._free(step, op)

    def _admitted(self, request: Any, hit_tokens: int) -> None:
        if self._lpc is not None:
            self._lpc.admitted(request, hit_tokens)

    def _free_request(self, request: Any) -> None:
        if self._lpc is None:
            super()._free_request(request)
        else:  # the LPC scheduler class's free path: the release announced, then vLLM's free
            self._lpc.free(request)

    def _record(self, step: int, op: str, *args: Any) -> StepRecord:
        if not self._outcomes_only:
            return super()._record(step, op, *args)
        request_id, hit_tokens, block_ids, evicted, held = args
        return StepRecord(
            self.config.name, step, op, request_id, hit_tokens, block_ids, evicted, held, (), ()
        )


def replay(
    vllm: Any,
    streams: Iterable[Stream],
    plans: dict[str, ReleasePlan],
    clock: StepClock,
    out: IO[str],
    outcomes_only: bool,
    before_free: Callable[[], None] | None = None,
    plugin: Any = None,
) -> dict[str, float]:
    """Each stream on a fresh `KVCacheManager`; with `plugin` (the LPC runtime), each
    manager's pool runs LPC as the LPC scheduler class runs it."""
    seconds: dict[str, float] = {}
    for stream in streams:
        plan = plans.get(stream.config.name, ReleasePlan())
        start = time.perf_counter()
        driver = PlannedReplay(vllm, stream, plan, clock, outcomes_only, before_free, plugin)
        for record in driver.run(stream.ops):
            out.write(record.to_json() + "\n")
        seconds[stream.config.name] = round(time.perf_counter() - start, 4)
    return seconds


def _streams(path: Path) -> Iterator[Stream]:
    with path.open(encoding="utf-8") as lines:
        yield from read_streams(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="JSON-lines operation streams")
    parser.add_argument("--plans", type=Path, help="release plans (lpc.drivers.release_plan)")
    parser.add_argument("--stock-output", type=Path, help="records of stock vLLM")
    parser.add_argument("--plugin-output", type=Path, help="records of vLLM with the LPC plugin")
    parser.add_argument(
        "--outcomes-only", action="store_true", help="leave free queue and cached set out"
    )
    parser.add_argument(
        "--predictor-url", help="the plugin asks this predictor (LPC_PREDICTOR_URL)"
    )
    parser.add_argument("--predictor-timeout-s", type=float, default=0.5)
    parser.add_argument(
        "--await-predictions-s",
        type=float,
        default=0.0,
        help="before each free, wait up to this long for predictions in flight (a real request "
        "lasts seconds, so its prediction is usually back when it ends); 0: never wait",
    )
    parser.add_argument(
        "--drain-predictions-s",
        type=float,
        default=0.0,
        help="after the plugin's replay, wait up to this long for predictions still in flight "
        "before reading its counters (so failures and timeouts are counted)",
    )
    parser.add_argument(
        "--request-log-dir", help="the plugin logs finished requests here (LPC_REQUEST_LOG_DIR)"
    )
    parser.add_argument(
        "--request-log-text", action="store_true", help="the log records user prompts"
    )
    parser.add_argument("--request-log-salt", help="the request log's deployment key")
    parser.add_argument(
        "--access-model",
        help="the plugin predicts with this access-only artifact in process (LPC_ACCESS_MODEL)",
    )
    parser.add_argument(
        "--evictor",
        default="lpc",
        help="the plugin's learned evictor (LPC_EVICTOR): lpc or lpc-pooled",
    )
    parser.add_argument(
        "--conversation-table-max-tokens",
        type=int,
        help="previous-request tokens the access model's conversation table keeps "
        "(LPC_CONVERSATION_TABLE_MAX_TOKENS; the plugin's default when not given)",
    )
    args = parser.parse_args(argv)
    if args.stock_output is None and args.plugin_output is None:
        parser.error("give --stock-output, --plugin-output or both")
    plans, settings = read_plans(args.plans) if args.plans else ({}, PluginSettings())
    try:
        start = time.perf_counter()
        vllm = vllm_replay.load_vllm(allow_other_version=False)
        import_seconds = round(time.perf_counter() - start, 2)
        summary: dict[str, Any] = {"vllm_version": vllm.version, "import_seconds": import_seconds}
        clock = StepClock()
        if args.stock_output is not None:
            with args.stock_output.open("w", encoding="utf-8") as sink:
                summary["stock_seconds"] = replay(
                    vllm, _streams(args.input), plans, clock, sink, args.outcomes_only
                )
        if args.plugin_output is not None:
            from lpc.integrations import vllm_plugin
            from lpc.integrations.config import PluginConfig

            config = PluginConfig(
                evictor=args.evictor,
                scale_per_s=settings.scale_per_s,
                fallback_probability=settings.fallback_probability,
                predictor_url=args.predictor_url,
                predictor_timeout_s=args.predictor_timeout_s,
                stats_log_interval_s=0.0,
                request_log_dir=args.request_log_dir,
                request_log_text=args.request_log_text,
                request_log_salt=args.request_log_salt,
                access_model=args.access_model,
                # The plans' probabilities ride in the requests as a trusted API layer would
                # set them (behind a router: `trust`).
                trust_request_hints=True,
                # Our block manager, which this replay is checked against step by step on
                # streams of several tenants (`cache_salt`), models no pinned cap.
                pinned_share=1.0,
            )
            if args.conversation_table_max_tokens is not None:
                config = dataclasses.replace(
                    config, conversation_table_max_tokens=args.conversation_table_max_tokens
                )
            plugin = vllm_plugin.install_runtime(config, clock=clock)

            def wait_for_predictions(timeout_s: float) -> None:
                deadline = time.monotonic() + timeout_s
                while vllm_plugin.stats_snapshot()["predictions_in_flight"]:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.001)

            before_free = None
            if args.await_predictions_s > 0:

                def before_free() -> None:
                    wait_for_predictions(args.await_predictions_s)

            try:
                with args.plugin_output.open("w", encoding="utf-8") as sink:
                    summary["plugin_seconds"] = replay(
                        vllm,
                        _streams(args.input),
                        plans,
                        clock,
                        sink,
                        args.outcomes_only,
                        before_free,
                        plugin,
                    )
                wait_for_predictions(args.drain_predictions_s)
                vllm_plugin.flush_request_log()
                summary["plugin_stats"] = vllm_plugin.stats_snapshot()
            finally:
                vllm_plugin.unregister()
    except (vllm_replay.DriverError, ImportError, ValueError) as exc:
        print(f"vllm_plugin_replay: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
