"""`lpc bench cache-policy` without vLLM: the plan, the summary and the command's checks.
(tests/vllm/test_cache_policy_bench.py runs the workers in vLLM's venv.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpc.benchmarks.cache_policy_bench import (
    POLICIES,
    TARGET_RATIO,
    summarise,
    worker_argv,
)
from lpc.benchmarks.cache_policy_plan import CachePolicyPlan, make_plan
from lpc.cli.main import main


def test_a_conversations_next_turn_extends_its_last_prompt() -> None:
    plan = make_plan(600, conversations=50, max_chunks_per_request=20, seed=3)
    last: dict[str, list[int]] = {}
    extended = 0
    for request in plan.requests:
        before = last.get(request.conversation_id)
        if before is not None:
            assert request.keys[: len(before)] == before
            assert 1 <= len(request.keys) - len(before) <= 6
            extended += 1
        assert len(request.keys) <= 20
        last[request.conversation_id] = request.keys
    assert extended > 400  # most requests continue a conversation
    times = [r.time_s for r in plan.requests]
    assert times == sorted(times)
    # keys are never shared across conversations
    owners: dict[int, str] = {}
    for request in plan.requests:
        for key in request.keys:
            assert owners.setdefault(key, request.conversation_id) == request.conversation_id


def test_the_plan_is_seeded_and_survives_json() -> None:
    plan = make_plan(200, seed=7)
    again = CachePolicyPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan == make_plan(200, seed=7)
    assert make_plan(200, seed=8) != plan


def test_the_plan_refuses_empty_sizes() -> None:
    with pytest.raises(ValueError):
        make_plan(0)
    with pytest.raises(ValueError):
        make_plan(10, num_chunks=0)


def _round(lru: float, lpc: float, pooled: float) -> dict[str, dict]:
    return {
        "lru": {"ns_per_op": lru, "ops": 100},
        "arc": {"ns_per_op": lru / 2, "ops": 99},
        "lpc": {"ns_per_op": lpc, "ops": 98},
        "lpc-pooled": {"ns_per_op": pooled, "ops": 97},
    }


def test_each_policy_keeps_its_best_round_and_is_judged_against_lru() -> None:
    result = summarise([_round(500, 900, 600), _round(400, 1000, 800)], 10, 20)
    assert result.ns_per_op == {"lru": 400, "arc": 200, "lpc": 900, "lpc-pooled": 600}
    assert result.ratios == {"arc": 0.5, "lpc": 2.25, "lpc-pooled": 1.5}
    assert result.meets_target == {"lpc": False, "lpc-pooled": True}
    assert result.target_ratio == TARGET_RATIO
    assert result.ops["lpc"] == 98 and result.runs == 2


def test_a_vanished_lru_time_gives_no_ratio() -> None:
    result = summarise([_round(0, 900, 600)], 10, 20)
    assert result.ratios["lpc"] is None and result.meets_target["lpc"] is False


def test_our_policies_are_loaded_by_module_path_and_vllms_by_name(tmp_path: Path) -> None:
    python, plan = tmp_path / "python", tmp_path / "plan.json"
    lpc = worker_argv(python, plan, "lpc", 2)
    assert lpc[3:] == [str(plan), "LPCCachePolicy", POLICIES["lpc"][1], "--repeats", "2"]
    assert worker_argv(python, plan, "lru", 1)[3:] == [str(plan), "lru", "--repeats", "1"]


def test_the_command_needs_the_vllm_venv(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nowhere" / "python"
    code = main(["bench", "cache-policy", "--vllm-python", str(missing)])
    assert code != 0
    assert "no vLLM venv" in capsys.readouterr().err
    assert main(["bench", "cache-policy", "--runs", "0", "--vllm-python", str(missing)]) != 0
