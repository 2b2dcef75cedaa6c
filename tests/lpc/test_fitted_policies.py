"""The fitted policies (wa, session-ref): their fits use the training part only, their
constants reach the evictors and the results JSON, and every release carries its category."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from eviction import LRUEvictor
from lpc.blocks.block_manager import CacheRequest, PrefixCacheBlockManager
from lpc.errors import InvalidInputError
from lpc.replay import simulator
from lpc.replay.ab_options import ABOptions
from lpc.replay.ab_run import run_ab
from lpc.replay.fitted_policies import (
    MAX_TURN,
    category_of,
    fit_cure_exponential,
    fit_session_timeout,
    fit_wa,
    request_categories,
)
from lpc.replay.policies import parse_policies, parse_policy
from lpc.workload import ScriptedTurn, WorkloadRequest
from tests.lpc.test_ab_cli import chats, run_json  # noqa: F401 (a fixture)
from tests.lpc.traces.helpers import bundled_lines, write_lines


def request(conv: str, turn: int, arrival: float, done: float, tokens=(1, 2, 3, 4)):
    t = ScriptedTurn(conv, turn, list(tokens), max(1, len(tokens) - 1), False)
    return WorkloadRequest(f"{conv}#{turn}", t, arrival, done)


def test_categories_are_type_and_turn_with_late_turns_merged() -> None:
    assert category_of("chat", 0) == "chat_1"
    assert category_of("file", 1) == "file_2"
    assert category_of("chat", MAX_TURN - 2) == f"chat_{MAX_TURN - 1}"
    assert category_of("chat", MAX_TURN - 1) == category_of("chat", 40) == f"chat_{MAX_TURN}+"
    reqs = [request("a", 0, 0, 1), request("a", 1, 5, 6), request("b", 0, 2, 3)]
    assert request_categories(reqs) == ["chat_1", "chat_2", "chat_1"]
    assert request_categories(reqs, {"a#1": "image"}) == ["chat_1", "image_2", "chat_1"]


def test_the_cure_model_fit_recovers_its_parameters_under_censoring() -> None:
    rng = np.random.default_rng(0)
    n, p, rate = 40_000, 0.35, 1 / 120
    release = rng.uniform(0, 3600, n)
    reused = rng.random(n) < p
    gap = rng.exponential(1 / rate, n)
    end = 3600.0
    seen = reused & (release + gap <= end)
    p_hat, rate_hat = fit_cure_exponential(gap[seen], end - release[~seen])
    assert p_hat == pytest.approx(p, abs=0.01)
    assert rate_hat == pytest.approx(rate, rel=0.03)
    naive = seen.sum() / n  # what ignoring censoring would say
    assert naive < p - 0.005
    assert fit_cure_exponential(np.array([]), np.array([10.0]))[0] == 0.0


def test_the_timeout_is_the_0_9_quantile_of_training_think_times() -> None:
    reqs = []
    for c in range(10):  # gaps of 10, 20, ..., 100 s between a completion and the next turn
        reqs += [request(f"c{c}", 0, 0.0, 1.0), request(f"c{c}", 1, 1.0 + 10 * (c + 1), 99.0)]
    fit = fit_session_timeout(reqs, "test")
    assert fit.gaps == 10
    assert fit.timeout_s == pytest.approx(float(np.quantile(range(10, 101, 10), 0.9)))
    assert fit_session_timeout(reqs[::2], "test").gaps == 0  # no second turn: the default


def test_wa_fit_counts_block_reuse_per_category_and_pools_the_thin_ones() -> None:
    block = 4
    reqs, hashes, cats = [], [], []
    # "chat_1" requests release 2 blocks; half of them see their prefix reused 10 s later.
    for i in range(300):
        prefix = [f"p{i}".encode(), f"q{i}".encode()]
        t = 100.0 * i
        reqs.append(request(f"c{i}", 0, t, t + 1, tokens=range(10)))
        hashes.append(prefix)
        cats.append("chat_1")
        if i % 2 == 0:
            reqs.append(request(f"c{i}", 1, t + 11, t + 12, tokens=range(10)))
            hashes.append(prefix)
            cats.append("chat_2")  # its own blocks are never reused: few reuses, pooled
    order = sorted(range(len(reqs)), key=lambda k: reqs[k].arrival_s)
    reqs, hashes, cats = ([x[k] for k in order] for x in (reqs, hashes, cats))
    fit = fit_wa(reqs, hashes, cats, block, end_s=30_100.0, fitted_on="test")
    one = fit.categories["chat_1"]
    assert one.source == "own" and one.releases == 600 and one.reuses == 300
    assert one.probability == pytest.approx(0.5, abs=0.01)
    assert 1 / one.rate_per_s == pytest.approx(10.0, rel=0.01)
    assert fit.categories["chat_2"].source == "type chat"  # no reuse of its own
    assert fit.default.source == "all" and fit.default.releases == 900


@pytest.fixture(scope="module")
def trace_runs(tmp_path_factory):
    """A Mooncake slice split at 100 s, replayed as it is and with its evaluation part cut
    short: the fits must not move.

    The first 291 lines arrive before 100 s (the training part); 182 and 82 evaluation lines
    are enough: a fit that also read the evaluation part would count 100 more requests in
    the full run and move. The short run replays one cache size and only the fitted
    policies beside LRU: the fits read neither."""
    root = tmp_path_factory.mktemp("fitted")
    lines = bundled_lines()[:473]
    full = write_lines(root / "full.jsonl", lines)
    short = write_lines(root / "short.jsonl", lines[:373])
    common = dict(split_at=100.0, workers=1, progress=False)
    runs = [
        run_ab(
            ABOptions(
                trace=path,
                out_dir=root / path.stem,
                cache_sizes_tokens=sizes,
                policies=tuple(parse_policies(policies)),
                **common,
            ),
            log=lambda _: None,
        )
        for path, sizes, policies in (
            (full, (1_000_000, 2_000_000), "lru,wa,session-ref,sae,lhd"),
            (short, (1_000_000,), "lru,wa,session-ref"),
        )
    ]
    return [r.to_json() for r in runs]


def test_the_fits_read_the_training_part_only(trace_runs) -> None:
    full, short = trace_runs
    fitted = full["workload"]["fitted_policies"]
    assert fitted == short["workload"]["fitted_policies"]
    assert fitted["session-ref"]["timeout_s"] > 0 and fitted["session-ref"]["gaps"] > 10
    assert "training part" in fitted["wa"]["fitted_on"]
    categories = fitted["wa"]["categories"]
    assert "chat_1" in categories and "chat_2" in categories
    for f in categories.values():
        assert 0.0 <= f["p"] <= 1.0 and f["mean_reuse_s"] > 0
    assert full["workload"]["requests"] > short["workload"]["requests"]


def test_the_fitted_and_new_policies_replay_and_report(trace_runs) -> None:
    full, _ = trace_runs
    hit = full["comparison"]["hit_ratio"]
    assert set(hit) == {"lru", "wa", "session-ref", "sae", "lhd"}
    for curve in hit.values():
        small, large = curve[1_000_000], curve[2_000_000]
        assert 0.0 < small <= large + 1e-12


def test_a_trace_without_a_training_part_refuses_the_fitted_policies(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", bundled_lines()[:300])
    options = ABOptions(
        trace=path,
        policies=tuple(parse_policies("lru,session-ref")),
        cache_sizes_tokens=(1_000_000,),
        split_at=0.0,
        workers=1,
        progress=False,
        out_dir=tmp_path / "out",
    )
    with pytest.raises(InvalidInputError, match="session-ref are fitted on the trace's training"):
        run_ab(options, log=lambda _: None)


def test_a_generated_workload_fits_on_the_training_half(chats, tmp_path, capsys) -> None:  # noqa: F811
    result = run_json(
        [
            "ab",
            "--out",
            str(tmp_path / "out"),
            "--dataset",
            str(chats),
            "--duration",
            "400",
            "--max-active",
            "20",
            "--cache-sizes",
            "4000",
            "--policies",
            "lru,wa,session-ref",
            "--think-time-sweep",
            "50",
            "--sweep-cache-size",
            "4000",
        ],
        capsys,
    )
    fitted = result["workload"]["fitted_policies"]
    assert "training half" in fitted["wa"]["fitted_on"]
    assert "training half" in fitted["session-ref"]["fitted_on"]
    sweep = result["workload"]["sweep_fitted_policies"]["50.0"]
    assert "λ_chat 50 s" in sweep["session-ref"]["fitted_on"]
    assert set(result["comparison"]["hit_ratio"]) == {"lru", "wa", "session-ref"}


class Recording(LRUEvictor):
    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.categories: list[str | None] = []

    def push_cached(self, freed, release) -> None:
        self.categories.append(release.category)
        super().push_cached(freed, release)


def test_the_block_manager_and_the_replay_hand_each_release_its_category(monkeypatch) -> None:
    manager = PrefixCacheBlockManager(8, block_size=2, evictor=Recording(8))
    req = CacheRequest("r", [1, 2, 3, 4, 5], 3, conversation_id="c")
    manager.allocate(req)
    manager.free("r", 1.0, None, "file_2")
    assert manager.evictor.categories == ["file_2"]

    made: list[Recording] = []

    def build(spec, num_blocks, *args, **kwargs):
        made.append(Recording(num_blocks))
        return made[-1]

    monkeypatch.setattr(simulator, "build_evictor", build)
    reqs = [request(f"c{i % 3}", i // 3, float(i), i + 0.5, tokens=range(10)) for i in range(9)]
    cats = request_categories(reqs)
    workload = simulator.prepare(reqs, 2, {}, categories=cats)
    simulator.replay(workload, parse_policy("lru"), 1000)
    assert made[0].categories == cats
    assert not math.isnan(workload.requests[0].completion_s)
