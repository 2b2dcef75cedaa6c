"""The plugin's in-process access model without vLLM: the conversation table's bounds, features
from engine state equal to the trace table's, the shared prefix from block hashes, the load
error, reload checks and the background thread."""

from __future__ import annotations

import random
import shutil
import sys
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lpc.benchmarks.release_bench import chained_hashes
from lpc.integrations.access_runtime import AccessRuntime, ReleaseItem, load_access_runtime
from lpc.integrations.config import PluginConfig, PluginConfigError, load_config
from lpc.integrations.conversation_table import (
    ConversationTable,
    StoredSequence,
    shared_prefix,
    shared_prefix_tokens,
)
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_plugin import PluginRuntime
from lpc.integrations.vllm_queue import QueueRuntime
from lpc.replay.request_table import request_table
from lpc.workload import ScriptedTurn, WorkloadRequest
from predictor.access_features import RequestState
from predictor.access_predictor import AccessPredictor
from tests.integrations.access_models import SHIPPED, publish


# -- the conversation table --------------------------------------------------------------------
def test_many_conversations_stay_within_the_table_bounds() -> None:
    """50,000 conversations through a table that holds 625: its size, its tokens and its
    dict's memory stop growing (the memory measured at a tenth of the stream and at its end)."""
    table = ConversationTable(max_conversations=1000, expiry_s=1e9, max_tokens=5000)
    request = RequestState(arrival_s=0.0, prompt_tokens=8, output_tokens=2, completion_s=1.0)
    tokens = StoredSequence(array("i", range(8)), 8)
    total = 50_000
    size_after = {}
    for i in range(total):
        table.finished(f"c{i}", request, float(i), tokens)
        if i + 1 in (total // 10, total):
            size_after[i + 1] = sys.getsizeof(table.entries)
    assert len(table) == 625  # 5000 tokens / 8 per conversation: the token bound binds
    assert table.stored_tokens == 5000
    assert table.evicted == total - 625
    assert size_after[total] == size_after[total // 10]  # memory stops growing
    assert list(table.entries)[-1] == f"c{total - 1}"  # the most recent survive


def test_count_bound_evicts_least_recently_updated() -> None:
    table = ConversationTable(max_conversations=2, expiry_s=1e9, max_tokens=10**6)
    request = RequestState(arrival_s=0.0, prompt_tokens=8)
    table.finished("a", request, 1.0)
    table.finished("b", request, 2.0)
    table.finished("a", request, 3.0)  # a is now the most recent
    table.finished("c", request, 4.0)
    assert list(table.entries) == ["a", "c"]
    assert table.state("a", 4.0).requests_so_far == 2


def test_idle_conversations_expire() -> None:
    table = ConversationTable(max_conversations=100, expiry_s=10.0, max_tokens=10**6)
    request = RequestState(arrival_s=0.0, prompt_tokens=8)
    table.finished("old", request, 0.0)
    table.finished("new", request, 8.0)
    assert table.state("old", 9.0).requests_so_far == 1
    assert table.state("old", 10.5).requests_so_far == 0  # idle 10.5 s > 10 s: forgotten
    assert table.expired == 1 and list(table.entries) == ["new"]


def test_shared_prefix_of_token_arrays() -> None:
    assert shared_prefix_tokens(array("i", [1, 2, 3, 4]), array("i", [1, 2, 9])) == 2
    assert shared_prefix_tokens(array("i", [1, 2]), array("q", [1, 2, 3])) == 2
    assert shared_prefix_tokens(None, array("i", [1])) == 0


@dataclass
class SequenceRequest:
    """What `StoredSequence.of_request` reads of vLLM's request."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]
    block_hashes: list[bytes]


def test_the_shared_prefix_from_block_hashes_equals_the_token_level_one() -> None:
    """Random previous sequences and prompts (extensions, edits anywhere, shorter prompts,
    another cache salt, no hashes, an unknown block size; stored as vLLM's lists or compacted):
    the hash-and-boundary value is the token-level longest common prefix, always."""
    rng = random.Random(22)
    for case in range(3000):
        block_size = rng.choice([1, 2, 4, 16])
        vocabulary = rng.choice([3, 50_000])  # few tokens: long accidental matches
        previous_prompt = [rng.randrange(vocabulary) for _ in range(rng.randrange(0, 120))]
        previous_output = [rng.randrange(vocabulary) for _ in range(rng.randrange(0, 40))]
        old = previous_prompt + previous_output
        kind = rng.randrange(4)
        if kind == 0:  # the next turn: the whole previous sequence and a new message
            prompt = old + [rng.randrange(vocabulary) for _ in range(rng.randrange(0, 50))]
        elif kind == 1:  # an edit somewhere
            prompt = list(old) + [rng.randrange(vocabulary) for _ in range(rng.randrange(1, 20))]
            prompt[rng.randrange(len(prompt))] = vocabulary + 1
        elif kind == 2:  # a shorter prompt (a retry of an earlier turn)
            prompt = old[: rng.randrange(0, len(old) + 1)]
        else:  # unrelated
            prompt = [rng.randrange(vocabulary) for _ in range(rng.randrange(0, 150))]
        output = [rng.randrange(vocabulary) for _ in range(rng.randrange(0, 30))]
        salt = "other" if rng.random() < 0.1 else ""
        stored = StoredSequence.of_request(
            SequenceRequest(previous_prompt, previous_output, chained_hashes(old, block_size))
        )
        if rng.random() < 0.5:
            assert stored.compact()
        hashes = chained_hashes(prompt + output, block_size, salt.encode())
        if rng.random() < 0.1:
            hashes = []  # prefix caching off: no hashes
        known_size = None if rng.random() < 0.1 else block_size
        expected = shared_prefix_tokens(array("i", old), array("i", prompt + output), len(prompt))
        got = shared_prefix(stored, prompt, len(prompt), hashes, known_size)
        assert got == expected, (case, block_size, kind, salt, known_size)


def test_a_long_extension_compares_one_block_of_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """128K previous tokens, a prompt extending them: O(log blocks) hashes, O(block) tokens."""
    old = list(range(128_000))
    stored = StoredSequence.of_request(SequenceRequest(old, [7] * 10, chained_hashes(old, 16)))
    prompt = old + [7] * 10 + [5] * 100
    compared: list[int] = []
    slice_of = StoredSequence.slice

    def counting(self: StoredSequence, start: int, stop: int) -> list[int]:
        compared.append(stop - start)
        return slice_of(self, start, stop)

    monkeypatch.setattr(StoredSequence, "slice", counting)
    hashes = chained_hashes(prompt, 16)
    assert shared_prefix(stored, prompt, len(prompt), hashes, 16) == 128_010
    assert sum(compared) <= 32  # the partial block after the last shared hash


def test_storing_a_request_references_its_lists_and_compaction_keeps_the_values() -> None:
    prompt, output = [1, 2, 3, 2**40], [4, 5]
    stored = StoredSequence.of_request(SequenceRequest(prompt, output, []))
    assert stored.tokens[0] is prompt and stored.num_tokens == 6  # no copy at the release
    assert stored.slice(2, 5) == [3, 2**40, 4]
    prompt.append(9)  # a list vLLM still owns may grow: the stored sequence does not
    assert stored.slice(3, 6) == [2**40, 4, 5]
    assert stored.compact() and isinstance(stored.tokens, array)
    assert stored.tokens.typecode == "q" and stored.slice(0, 6) == [1, 2, 3, 2**40, 4, 5]


# -- features from engine state == features from the trace table ----------------------------
@dataclass
class Params:
    extra_args: dict[str, Any] | None = None


@dataclass
class FakeRequest:
    """The attributes of vLLM's `Request` the plugin reads at a release."""

    request_id: str
    arrival_time: float
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    conversation_id: str
    finished: bool = True
    sampling_params: Params = field(default_factory=Params)

    def __post_init__(self) -> None:
        self.sampling_params = Params({"lpc_conversation_id": self.conversation_id})

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def is_finished(self) -> bool:
        return self.finished


def synthetic_requests(seed: int = 4) -> list[WorkloadRequest]:
    """Multi-turn conversations whose prompts extend the previous prompt and reply, with
    think times, occasional edits (a shorter shared prefix) and turns that arrive before the
    previous one finished (a branch or retry: features then follow the finishing order)."""
    rng = random.Random(seed)
    out = []
    for c in range(30):
        tokens = [rng.randrange(50_000) for _ in range(rng.randrange(20, 200))]
        t = rng.uniform(0, 600)
        for turn in range(rng.randrange(1, 6)):
            if turn and rng.random() < 0.2:
                tokens = tokens[: rng.randrange(1, len(tokens))]  # an edited history
            prompt = tokens + [rng.randrange(50_000) for _ in range(rng.randrange(5, 80))]
            output = [rng.randrange(50_000) for _ in range(rng.randrange(1, 120))]
            done = t + rng.uniform(0.5, 20)
            script = ScriptedTurn(f"c{c}", turn, tuple(prompt + output), len(prompt), True)
            out.append(WorkloadRequest(f"c{c}-{turn}", script, t, done))
            tokens = prompt + output
            overlaps = rng.random() < 0.25  # the next turn may finish before this one
            t = rng.uniform(t, done) if overlaps else done + rng.expovariate(1 / 60)
    return sorted(out, key=lambda r: r.arrival_s)


def engine_request(r: WorkloadRequest) -> FakeRequest:
    turn = r.turn
    return FakeRequest(
        r.request_id,
        r.arrival_s,
        list(turn.token_ids[: turn.num_prompt_tokens]),
        list(turn.token_ids[turn.num_prompt_tokens :]),
        r.conversation_id,
    )


def replay_releases(runtime: AccessRuntime, requests: list[WorkloadRequest]) -> dict[str, float]:
    """Release every request at its completion, in completion order, as the engine would."""
    out = {}
    for r in sorted(requests, key=lambda r: r.completion_s):
        out[r.request_id] = runtime.predict_release(
            engine_request(r), r.conversation_id, r.completion_s, r.turn.num_prompt_tokens
        )
    return out


def test_engine_state_predictions_equal_the_trace_table_s() -> None:
    requests = synthetic_requests()
    assert len(requests) > 60
    config = PluginConfig(access_model=str(SHIPPED))
    runtime = AccessRuntime.load(config, PluginStats())
    assert runtime.needs_tokens
    engine = replay_releases(runtime, requests)
    table = request_table(requests)
    assert (table["shared_prefix_tokens"] > 0).any()
    previous_completion = table.groupby("conversation_id")["completion_s"].shift(1)
    overlapping = table["arrival_s"] < previous_completion
    assert overlapping.sum() >= 5
    expected = AccessPredictor.load(SHIPPED).predict_table(table)
    got = np.array([engine[r.request_id] for r in requests])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert len(set(np.round(got, 4))) > 10  # the model distinguishes requests


# -- loading and reloading ---------------------------------------------------------------------
def test_a_bad_artifact_is_one_clear_error_at_load(tmp_path: Path) -> None:
    with pytest.raises(PluginConfigError, match=r"LPC_ACCESS_MODEL.*nowhere.*does not exist"):
        load_access_runtime(PluginConfig(access_model=str(tmp_path / "nowhere")), PluginStats())
    corrupt = tmp_path / "corrupt"
    shutil.copytree(SHIPPED, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(PluginConfigError, match=r"LPC_ACCESS_MODEL.*corrupt"):
        load_access_runtime(PluginConfig(access_model=str(corrupt)), PluginStats())


def test_settings_come_from_the_environment() -> None:
    config = load_config(
        {
            "LPC_ACCESS_MODEL": "/models/registry",
            "LPC_ACCESS_MODEL_RELOAD_S": "30",
            "LPC_CONVERSATION_TABLE_SIZE": "500",
            "LPC_CONVERSATION_EXPIRY_S": "120",
            "LPC_CONVERSATION_TABLE_MAX_TOKENS": "9000",
        }
    )
    assert (config.access_model, config.access_model_reload_s) == ("/models/registry", 30.0)
    assert config.conversation_table_size == 500 and config.conversation_expiry_s == 120.0
    assert config.conversation_table_max_tokens == 9000
    with pytest.raises(PluginConfigError, match="LPC_CONVERSATION_TABLE_SIZE"):
        load_config({"LPC_CONVERSATION_TABLE_SIZE": "0"})


def _logit(p: float) -> float:
    return float(np.log(p / (1.0 - p)))


def registry_runtime(tmp_path: Path) -> tuple[PluginRuntime, Path, PluginStats]:
    registry = tmp_path / "registry"
    registry.mkdir()
    publish(registry, "v0001")
    stats = PluginStats()
    queues = QueueRuntime(PluginConfig(), stats, clock=lambda: 0.0)
    config = PluginConfig(access_model=str(registry), access_model_reload_s=60.0)
    runtime = PluginRuntime(config, stats, queues, None, None)
    runtime.wall_clock = lambda: 0.0
    runtime.access = load_access_runtime(config, stats)
    assert runtime.access is not None
    return runtime, registry, stats


def release_p(runtime: PluginRuntime, i: int) -> float:
    fake = FakeRequest(f"r{i}", -5.0, [1, 2, 3] * 100, [4] * 50, f"c{i}")
    release, source = runtime.release_and_source(fake)
    assert source == "model"
    return release.probability


def test_a_promoted_model_is_picked_up_by_a_check(tmp_path: Path) -> None:
    runtime, registry, stats = registry_runtime(tmp_path)
    access = runtime.access
    assert access is not None
    first = release_p(runtime, 0)
    publish(registry, "v0002", bias=3.0)
    assert release_p(runtime, 1) == pytest.approx(first)  # no check yet: still v0001
    access.check_for_promoted_model()
    # v0002 swapped in: its logit is v0001's plus the bias (compared as logits, since the
    # shipped model may put this short first request near p = 0).
    assert _logit(release_p(runtime, 2)) == pytest.approx(_logit(first) + 3.0, abs=1e-3)
    assert access.pointer[0].endswith("v0002")
    assert stats.access_model_reloads == 1

    broken = publish(registry, "v0003")
    (broken / "model.safetensors").write_bytes(b"not weights")
    access.check_for_promoted_model()
    assert release_p(runtime, 3) == pytest.approx(release_p(runtime, 4))
    assert access.pointer[0].endswith("v0002")  # the old model stays
    assert stats.access_model_reload_failures == 1
    access.check_for_promoted_model()
    release_p(runtime, 5)
    assert stats.access_model_reload_failures == 1  # counted once per failed artifact
    assert stats.predictions_in_process == 6 and stats.predictions_used == 6


def test_the_release_path_does_no_file_io(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """However long the engine runs, a release never looks at the model folder: only the
    background thread (or an explicit check) does."""
    runtime, _, stats = registry_runtime(tmp_path)
    from lpc.integrations import access_runtime, artifact_folders

    looked = []
    monkeypatch.setattr(artifact_folders, "artifact_pointer", lambda path: looked.append(path))
    monkeypatch.setattr(access_runtime, "load_checked", lambda folder: looked.append(folder))
    times = iter(range(0, 10**6, 100))
    runtime.wall_clock = lambda: float(next(times))
    for i in range(50):
        release_p(runtime, i)
    assert looked == [] and stats.predictions_in_process == 50


def test_the_background_thread_reloads_a_promoted_model(tmp_path: Path) -> None:
    runtime, registry, stats = registry_runtime(tmp_path)
    access = runtime.access
    assert access is not None
    access.reload_s = 0.05
    access.start_background()
    try:
        assert access._thread is not None and access._thread.name == "lpc-access-model"
        publish(registry, "v0002", bias=3.0)
        deadline = time.monotonic() + 30.0
        while stats.access_model_reloads == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert access.pointer[0].endswith("v0002") and stats.access_model_reloads == 1
        # Sequences stored by releases are compacted by the same thread.
        release_p(runtime, 0)
        entry = access.table.entries["c0"]
        assert entry.previous is not None
        while not isinstance(entry.previous.tokens, array) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert isinstance(entry.previous.tokens, array)
        assert entry.previous.slice(0, 4) == [1, 2, 3, 1]
    finally:
        access.stop_background()
    assert not any(t.name == "lpc-access-model" for t in threading.enumerate())


def test_a_text_artifact_stays_with_the_predictor_rpc() -> None:
    text_model = str(SHIPPED.parent / "sharegpt-e5-small-q4")
    with pytest.raises(PluginConfigError, match=r"LPC_ACCESS_MODEL.*text.*LPC_PREDICTOR_URL"):
        load_access_runtime(PluginConfig(access_model=text_model), PluginStats())
    config = PluginConfig(access_model=text_model, predictor_url="http://127.0.0.1:8476")
    assert load_access_runtime(config, PluginStats()) is None


def test_requests_carrying_p_still_feed_the_conversation_history() -> None:
    stats = PluginStats()
    config = PluginConfig(
        access_model=str(SHIPPED), access_model_reload_s=0.0, trust_request_hints=True
    )
    runtime = PluginRuntime(config, stats, QueueRuntime(config, stats, lambda: 0.0), None, None)
    runtime.access = load_access_runtime(config, stats)
    assert runtime.access is not None
    runtime.wall_clock = lambda: 10.0
    first = FakeRequest("r0", 1.0, [1, 2, 3], [4, 5], "c")
    first.sampling_params.extra_args["lpc_probability"] = 0.9
    assert runtime.release_and_source(first)[1] == "client"
    assert stats.predictions_in_process == 0
    state = runtime.access.table.state("c", 10.0)
    assert (state.requests_so_far, state.last_completion_s, state.last_output_tokens) == (
        1,
        10.0,
        2,
    )
    runtime.wall_clock = lambda: 30.0
    second = FakeRequest("r1", 20.0, [1, 2, 3, 4, 9], [7], "c")
    assert runtime.release_and_source(second)[1] == "model"
    assert runtime.access.table.state("c", 30.0).think_time_sum_s == 10.0


def test_a_request_the_model_cannot_read_gets_the_fallback() -> None:
    stats = PluginStats()
    config = PluginConfig(access_model=str(SHIPPED), access_model_reload_s=0.0)
    runtime = PluginRuntime(config, stats, QueueRuntime(config, stats, lambda: 0.0), None, None)
    runtime.access = load_access_runtime(config, stats)
    broken = FakeRequest("r0", 1.0, [1, 2, 3], [4], "c")
    broken.arrival_time = None  # type: ignore[assignment]
    release, source = runtime.release_and_source(broken)
    assert (release.probability, source) == (None, "fallback")
    assert stats.access_prediction_errors == 1 and stats.fallbacks_used == 1


# -- one scoring call for a scheduler step's finished requests ---------------------------------
def step_runtime(stats: PluginStats) -> PluginRuntime:
    config = PluginConfig(
        access_model=str(SHIPPED), access_model_reload_s=0.0, trust_request_hints=True
    )
    runtime = PluginRuntime(config, stats, QueueRuntime(config, stats, lambda: 0.0), None, None)
    runtime.access = load_access_runtime(config, stats)
    assert runtime.access is not None
    return runtime


def test_a_step_s_one_scoring_call_gives_each_release_its_one_by_one_p() -> None:
    """The scheduler class scores the requests a step finishes in one forward pass
    (`score_finished`), then releases them. Against releasing each alone: the same source,
    the p to float32 round-off (bit for bit when the step finished one request), the same
    conversation table after every step, and one model call per step instead of one per
    release. The steps group consecutive completions, up to 12 (several turns of one
    conversation among them), with requests that carry their own p and one the model cannot
    read."""
    requests = sorted(synthetic_requests(seed=7), key=lambda r: r.completion_s)
    rng = random.Random(3)
    steps, i = [], 0
    while i < len(requests):
        size = rng.choice([1, 1, 2, 3, 5, 12])
        steps.append(requests[i : i + size])
        i += size
    assert any(len({r.conversation_id for r in step}) < len(step) for step in steps), (
        "a step finishing two turns of one conversation"
    )
    hinted = {r.request_id for r in requests[::9]}
    unreadable = requests[20].request_id
    alone_stats, batched_stats = PluginStats(), PluginStats()
    alone, batched = step_runtime(alone_stats), step_runtime(batched_stats)
    scoring_steps = 0
    for step in steps:
        now = max(r.completion_s for r in step)
        alone.wall_clock = batched.wall_clock = lambda now=now: now
        fakes = {}
        for side in ("alone", "batched"):
            fakes[side] = [engine_request(r) for r in step]
            for fake in fakes[side]:
                if fake.request_id in hinted:
                    fake.sampling_params.extra_args["lpc_probability"] = 0.25
                if fake.request_id == unreadable:
                    fake.arrival_time = None  # type: ignore[assignment]
        batched.score_finished(fakes["batched"])
        scoring_steps += any(
            f.request_id not in hinted and f.request_id != unreadable for f in fakes["batched"]
        )
        for one, other in zip(fakes["alone"], fakes["batched"], strict=True):
            (want, want_source), (got, got_source) = (
                alone.release_and_source(one),
                batched.release_and_source(other),
            )
            assert got_source == want_source, one.request_id
            if want.probability is None or len(step) == 1:
                assert got.probability == want.probability, one.request_id
            else:
                assert abs(got.probability - want.probability) < 1e-6, one.request_id
        assert batched.scored == {} and batched.scored_hints == {}, "every release took its own"
        for r in step:
            cid = r.conversation_id
            assert batched.access.table.state(cid, now) == alone.access.table.state(cid, now)
    assert len(steps) < len(requests) - len(hinted), "fewer steps than model releases"
    assert alone_stats.in_process_scoring_calls == alone_stats.predictions_in_process
    assert batched_stats.in_process_scoring_calls == scoring_steps
    for name in (
        "releases",
        "predictions_in_process",
        "probabilities_from_request",
        "access_prediction_errors",
        "fallbacks_used",
        "plugin_errors",
    ):
        assert getattr(batched_stats, name) == getattr(alone_stats, name), name
    assert batched_stats.access_prediction_errors == 1


def test_a_failing_model_costs_the_step_s_releases_their_p_not_the_step() -> None:
    stats = PluginStats()
    runtime = step_runtime(stats)
    assert runtime.access is not None and runtime.access.model is not None

    def broken(rows: object) -> list[float]:
        raise FloatingPointError("the forward pass failed")

    runtime.access.model.predictor.predict_rows = broken  # type: ignore[method-assign]
    runtime.wall_clock = lambda: 50.0
    fakes = [FakeRequest(f"r{i}", 1.0, [1, 2, 3], [4, 5], f"c{i}") for i in range(3)]
    runtime.score_finished(fakes)
    for fake in fakes:
        release, source = runtime.release_and_source(fake)
        assert (release.probability, source) == (None, "fallback")
    assert stats.access_prediction_errors == 3 and stats.plugin_errors == 0
    assert runtime.access.table.state("c1", 50.0).requests_so_far == 1, "history recorded"


def test_each_step_s_scoring_pass_is_timed_once_failed_or_not() -> None:
    """`lpc_scoring_seconds` holds one observation per step that scored anything (the pass
    runs before the frees, so the free and release histograms miss it): none for a step
    that finished nothing, one for a failed pass too."""
    stats = PluginStats()
    runtime = step_runtime(stats)
    assert runtime.access is not None and runtime.access.model is not None
    scoring = runtime.queues.histograms.scoring_latency_ns
    runtime.wall_clock = lambda: 50.0
    runtime.score_finished([])
    assert scoring.snapshot().count == 0
    fakes = [FakeRequest(f"r{i}", 1.0, [1, 2, 3], [4, 5], f"c{i}") for i in range(3)]
    runtime.score_finished(fakes)
    timed = scoring.snapshot()
    assert timed.count == 1 and timed.total > 0
    assert runtime.queues.histograms.release_latency_ns.snapshot().count == 0

    def broken(items: object) -> list[object]:
        raise RuntimeError("the table is broken")

    runtime.scored.clear()
    runtime.access.release_many = broken  # type: ignore[method-assign]
    runtime.score_finished(fakes)
    assert scoring.snapshot().count == 2 and stats.plugin_errors == 1
    assert runtime.scored == {}, "every release computes its own"


def test_a_step_s_return_curves_come_from_one_pass_to_round_off() -> None:
    """With the return-time model loaded too, `release_many` runs each model once per step:
    the curves from one batched pass equal each release's own (`curve_one`) to float32
    round-off, a step of one runs `release` itself, and the counters match one by one."""
    from lpc.integrations.return_runtime import load_return_runtime

    config = PluginConfig(
        access_model=str(SHIPPED),
        return_model=str(SHIPPED.parent / "mooncake-return"),
        access_model_reload_s=0.0,
        return_model_reload_s=0.0,
    )
    runtimes, stats = [], []
    for _ in range(2):
        counters = PluginStats()
        runtime = load_access_runtime(config, counters, load_return_runtime(config, counters))
        assert runtime is not None and runtime.returns is not None
        runtimes.append(runtime)
        stats.append(counters)
    alone, batched = runtimes
    predictor = batched.returns.model.predictor
    passes = {"curves": 0, "curve_one": 0}
    for name in passes:
        original = getattr(predictor, name)

        def counted(*args: Any, name: str = name, original: Any = original) -> Any:
            passes[name] += 1
            return original(*args)

        setattr(predictor, name, counted)
    requests = sorted(synthetic_requests(seed=5), key=lambda r: r.completion_s)
    steps = [requests[i : i + 4] for i in range(0, len(requests), 4)]
    for step in steps:
        now = max(r.completion_s for r in step)
        items = [
            ReleaseItem(engine_request(r), r.conversation_id, now, r.turn.num_prompt_tokens)
            for r in step
        ]
        got = batched.release_many(items)
        for item, outcome in zip(items, got, strict=True):
            want = alone.release(*item)
            assert outcome is not None and outcome.curve is not None and want.curve is not None
            np.testing.assert_allclose(outcome.curve.survival, want.curve.survival, rtol=1e-5)
            assert outcome.probability == pytest.approx(want.probability, abs=1e-6)
    several = sum(len(step) > 1 for step in steps)
    assert passes == {"curves": several, "curve_one": len(steps) - several}
    assert stats[1].return_curves_in_process == stats[0].return_curves_in_process == len(requests)
    assert stats[1].in_process_scoring_calls == len(steps)
