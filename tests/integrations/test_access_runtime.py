"""The plugin's in-process access model without vLLM: the conversation table's bounds, features
from engine state equal to the trace table's, the load error, and reload on a fake clock."""

from __future__ import annotations

import random
import shutil
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lpc.access.table import request_table
from lpc.integrations.access_runtime import AccessRuntime, load_access_runtime
from lpc.integrations.config import PluginConfig, PluginConfigError, load_config
from lpc.integrations.conversation_table import ConversationTable, shared_prefix_tokens
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_plugin import PluginRuntime
from lpc.integrations.vllm_queue import QueueRuntime
from lpc.workload import ScriptedTurn, WorkloadRequest
from predictor.access_features import RequestState
from predictor.access_predictor import AccessPredictor
from tests.integrations.access_models import SHIPPED, publish


# -- the conversation table --------------------------------------------------------------------
def test_a_million_conversations_stay_within_the_table_bounds() -> None:
    table = ConversationTable(max_conversations=1000, expiry_s=1e9, max_tokens=5000)
    request = RequestState(arrival_s=0.0, prompt_tokens=8, output_tokens=2, completion_s=1.0)
    tokens = array("i", range(8))
    size_after = {}
    for i in range(1_000_000):
        table.finished(f"c{i}", request, float(i), tokens)
        if i + 1 in (100_000, 1_000_000):
            size_after[i + 1] = sys.getsizeof(table.entries)
    assert len(table) == 625  # 5000 tokens / 8 per conversation: the token bound binds
    assert table.stored_tokens == 5000
    assert table.evicted == 1_000_000 - 625
    assert size_after[1_000_000] == size_after[100_000]  # memory stops growing
    assert list(table.entries)[-1] == "c999999"  # the most recent survive


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


def replay_releases(runtime: AccessRuntime, requests: list[WorkloadRequest]) -> dict[str, float]:
    """Release every request at its completion, in completion order, as the engine would."""
    out = {}
    for r in sorted(requests, key=lambda r: r.completion_s):
        turn = r.turn
        fake = FakeRequest(
            r.request_id,
            r.arrival_s,
            list(turn.token_ids[: turn.num_prompt_tokens]),
            list(turn.token_ids[turn.num_prompt_tokens :]),
            r.conversation_id,
        )
        out[r.request_id] = runtime.predict_release(
            fake, r.conversation_id, r.completion_s, turn.num_prompt_tokens
        )
    return out


def test_engine_state_predictions_equal_the_trace_table_s() -> None:
    requests = synthetic_requests()
    assert len(requests) > 60
    config = PluginConfig(access_model=str(SHIPPED))
    runtime = AccessRuntime.load(config, PluginStats(), now_s=0.0)
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
        load_access_runtime(
            PluginConfig(access_model=str(tmp_path / "nowhere")), PluginStats(), 0.0
        )
    corrupt = tmp_path / "corrupt"
    shutil.copytree(SHIPPED, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(PluginConfigError, match=r"LPC_ACCESS_MODEL.*corrupt"):
        load_access_runtime(PluginConfig(access_model=str(corrupt)), PluginStats(), 0.0)


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


def test_a_promoted_model_is_picked_up_on_schedule(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    publish(registry, "v0001")
    now = [0.0]
    stats = PluginStats()
    queues = QueueRuntime(PluginConfig(), stats, clock=lambda: now[0])
    config = PluginConfig(access_model=str(registry), access_model_reload_s=60.0)
    runtime = PluginRuntime(config, stats, queues, None, None)
    runtime.wall_clock = lambda: now[0]
    runtime.access = load_access_runtime(config, stats, now[0])
    assert runtime.access is not None

    def release(i: int) -> float:
        fake = FakeRequest(f"r{i}", now[0] - 5, [1, 2, 3] * 100, [4] * 50, f"c{i}")
        release, source = runtime.release_and_source(fake)
        assert source == "model"
        return release.probability

    first = release(0)
    publish(registry, "v0002", bias=3.0)
    now[0] = 30.0
    assert release(1) == pytest.approx(first)  # not yet due: still v0001
    now[0] = 61.0
    # v0002 swapped in: its logit is v0001's plus the bias (compared as logits, since the
    # shipped model may put this short first request near p = 0).
    assert _logit(release(2)) == pytest.approx(_logit(first) + 3.0, abs=1e-3)
    assert runtime.access.pointer[0].endswith("v0002")
    assert stats.access_model_reloads == 1

    broken = publish(registry, "v0003")
    (broken / "model.safetensors").write_bytes(b"not weights")
    now[0] = 125.0
    assert release(3) == pytest.approx(release(4))
    assert runtime.access.pointer[0].endswith("v0002")  # the old model stays
    assert stats.access_model_reload_failures == 1
    now[0] = 200.0
    release(5)
    assert stats.access_model_reload_failures == 1  # counted once per failed artifact
    assert stats.predictions_in_process == 6 and stats.predictions_used == 6


def test_a_text_artifact_stays_with_the_predictor_rpc() -> None:
    text_model = str(SHIPPED.parent / "sharegpt-e5-small-q4")
    with pytest.raises(PluginConfigError, match=r"LPC_ACCESS_MODEL.*text.*LPC_PREDICTOR_URL"):
        load_access_runtime(PluginConfig(access_model=text_model), PluginStats(), 0.0)
    config = PluginConfig(access_model=text_model, predictor_url="http://127.0.0.1:8476")
    assert load_access_runtime(config, PluginStats(), 0.0) is None


def test_requests_carrying_p_still_feed_the_conversation_history() -> None:
    stats = PluginStats()
    config = PluginConfig(access_model=str(SHIPPED), access_model_reload_s=0.0)
    runtime = PluginRuntime(config, stats, QueueRuntime(config, stats, lambda: 0.0), None, None)
    runtime.access = load_access_runtime(config, stats, 0.0)
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
    runtime.access = load_access_runtime(config, stats, 0.0)
    broken = FakeRequest("r0", 1.0, [1, 2, 3], [4], "c")
    broken.arrival_time = None  # type: ignore[assignment]
    release, source = runtime.release_and_source(broken)
    assert (release.probability, source) == (None, "fallback")
    assert stats.access_prediction_errors == 1 and stats.fallbacks_used == 1
