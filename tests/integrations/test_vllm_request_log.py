"""The plugin's request log inside real vLLM 0.33.0: what vLLM+plugin served, replayed.

scripts/vllm_trace_ab.py replays a trace through vLLM's KVCacheManager with the plugin, which
logs every finished request (from vLLM's `Request`: arrival, prompt and output tokens, block
hashes; its prefix-cache hit from `get_computed_blocks`; the probability it used). Then
`lpc ab --trace LOGDIR` replays the log: it must reproduce vLLM+plugin's hit ratio, and the
log must hold no prompt text unless asked.

Marked `vllm`: `pytest -m vllm tests/integrations` after `bash scripts/setup_vllm_plugin.sh`.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from lpc.cli.main import main
from lpc.replay.probability import OracleSource
from lpc.traces.lpc_trace import write_trace
from lpc.workload import ScriptedTurn, WorkloadConfig, open_loop_requests
from tests.integrations.report import REPORT
from tests.integrations.snippets import run_vllm_trace_ab
from tests.lpc.synthetic import conversations

pytestmark = pytest.mark.vllm

CACHE_TOKENS = 20_000
SCALE = 1e-2


def secret_word(conversation_id: str, turn: int) -> str:
    return f"quokkaphrase{conversation_id}x{turn}"


def trace_with_prompts(path: Path, count: int) -> Path:
    """Synthetic chats whose user prompts hold words the log must not contain by default;
    a fifth of the probabilities missing (the plugin's fallback)."""
    scripts = [
        [
            ScriptedTurn(
                t.conversation_id,
                t.turn_index,
                t.token_ids,
                t.num_prompt_tokens,
                t.has_next_turn,
                tuple(secret_word(t.conversation_id, k) for k in range(t.turn_index + 1)),
            )
            for t in conversation
        ]
        for conversation in conversations(count, seed=5)
    ]
    requests = open_loop_requests(
        scripts, WorkloadConfig(duration_s=900, max_active_conversations=40, seed=3)
    )
    rng = random.Random(1)
    oracle = OracleSource().predict([r.turn for r in requests])
    probabilities = [None if rng.random() < 0.2 else p for p in oracle]
    write_trace(path, requests, {"source": "synthetic chats"}, probabilities)
    return path


def vllm_with_log(trace: Path, logs: Path, vllm_python: Path, *extra: str) -> dict:
    return run_vllm_trace_ab(
        trace,
        vllm_python,
        CACHE_TOKENS,
        *("--scale", str(SCALE), "--request-log-dir", str(logs), *extra),
    )


def replay_log(
    logs: Path, policies: str, cache_tokens: int, scale: float, tmp_path: Path, capsys
) -> tuple[dict, float]:
    """`lpc ab --trace <logs>` from the first request: the log's own engine figures and the
    replayed `lpc-trace` hit ratio."""
    code = main(
        [
            *("ab", "--no-progress", "--trace", str(logs), "--split-at", "0"),
            *("--policies", policies, "--cache-sizes", str(cache_tokens)),
            *("--scale", str(scale), "--fallback-p", "0.5", "--out", str(tmp_path / "ab")),
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    engine = report["workload"]["trace"]["request_log"]
    return engine, next(iter(report["comparison"]["hit_ratio"]["lpc-trace"].values()))


def test_the_plugin_s_log_replays_to_vllm_s_hit_ratio(
    vllm_python: Path, tmp_path: Path, capsys
) -> None:
    trace = trace_with_prompts(tmp_path / "trace.jsonl", 400)
    logs = tmp_path / "logs"
    result = vllm_with_log(trace, logs, vllm_python)
    plugin = {row["policy"]: row for row in result["rows"]}["lpc-trace"]
    stats = result["plugin_stats"]
    requests = result["requests"]
    assert stats["request_log_records_written"] == requests
    assert stats["request_log_records_dropped"] == 0
    text = "".join(p.read_text() for p in logs.glob("requests-*.jsonl"))
    assert stats["request_log_bytes_written"] == len(text.encode())
    assert "quokkaphrase" not in text  # no prompt text by default

    engine, replayed = replay_log(logs, "lpc-trace,lru", CACHE_TOKENS, SCALE, tmp_path, capsys)
    # The log's own cached tokens are vLLM's hits, and replaying the log reproduces them.
    assert engine["engine_token_hit_ratio"] == pytest.approx(plugin["vllm_hit_ratio"], abs=1e-12)
    assert abs(replayed - plugin["vllm_hit_ratio"]) * 100 <= 0.1
    REPORT.append(
        f"request log of vLLM+plugin ({requests} requests, {CACHE_TOKENS} tokens): vLLM "
        f"{100 * plugin['vllm_hit_ratio']:.3f}%, the log's cached tokens "
        f"{100 * engine['engine_token_hit_ratio']:.3f}%, lpc ab --trace on the log "
        f"{100 * replayed:.3f}%; {stats['request_log_bytes_written']} bytes"
    )


def test_prompt_text_only_when_asked(vllm_python: Path, tmp_path: Path) -> None:
    trace = trace_with_prompts(tmp_path / "trace.jsonl", 40)
    logs = tmp_path / "logs"
    result = vllm_with_log(trace, logs, vllm_python, "--request-log-text")
    text = "".join(p.read_text() for p in logs.glob("requests-*.jsonl"))
    assert result["plugin_stats"]["request_log_records_written"] == result["requests"]
    assert "quokkaphrase" in text


@pytest.mark.slow
@pytest.mark.engine_trace
def test_mooncake_through_vllm_logs_retrain_and_replay(
    vllm_python: Path, tmp_path: Path, capsys
) -> None:
    """End to end on real traffic: the bundled Mooncake trace (one hour, moved to start
    yesterday, so the daily job's window holds it) through vLLM + plugin writes request logs;
    `lpc retrain --logs` trains an access-only model on them; `lpc ab --trace` on the same
    logs reproduces vLLM's hit ratio; a running `lpc serve` (holding the shipped access model)
    reloads the model the job promotes. A documented command (`engine_trace`), not CI: there
    the log's replay is checked on synthetic chats above, and the daily job on request logs by
    the slow tests of step 1b."""
    import httpx

    from lpc.traces.load import TraceOptions, load_trace
    from lpc.workload import WorkloadRequest
    from predictor.access_predictor import AccessPredictor
    from predictor.server import ServerConfig, create_app
    from tests.integrations.access_models import SHIPPED
    from tests.predictor.server_harness import running_server

    day_s = 86_400.0
    base_s = (time.time() // day_s - 1) * day_s  # yesterday 00:00 UTC
    imported = load_trace("mooncake", TraceOptions()).requests
    moved = [
        WorkloadRequest(r.request_id, r.turn, r.arrival_s + base_s, r.completion_s + base_s)
        for r in imported
    ]
    trace = tmp_path / "mooncake.jsonl"
    write_trace(trace, moved, {"source": "bundled Mooncake conversation trace"})
    logs = tmp_path / "logs"
    cache_tokens = 2_500_000  # above the slice's peak in-flight tokens: no allocation fails
    result = run_vllm_trace_ab(
        trace, vllm_python, cache_tokens, *("--block-size", "512", "--request-log-dir", str(logs))
    )
    plugin = {row["policy"]: row for row in result["rows"]}["lpc-trace"]
    assert plugin["vllm_evictions"] > 0 and plugin["vllm_failures"] == 0
    assert result["plugin_stats"]["request_log_records_written"] == len(moved)

    engine, replayed = replay_log(logs, "lpc-trace", cache_tokens, 0.01, tmp_path, capsys)
    assert engine["engine_token_hit_ratio"] == pytest.approx(plugin["vllm_hit_ratio"], abs=1e-12)
    assert abs(replayed - plugin["vllm_hit_ratio"]) * 100 <= 0.1

    registry = tmp_path / "registry"
    registry.mkdir()
    served = AccessPredictor.load(SHIPPED)
    config = ServerConfig(model_root=registry)  # reloads may load only the registry's versions
    with running_server(create_app(config, served, artifact_path=SHIPPED), config) as (url, _):
        before = httpx.get(f"{url}/healthz").json()["model"]
        retrain = ["retrain", "--logs", str(logs), "--registry", str(registry), "--json"]
        code = main([*retrain, "--notify-url", url])
        outcome = json.loads(capsys.readouterr().out)
        after = httpx.get(f"{url}/healthz").json()["model"]
    assert code == 0 and outcome["status"] == "promoted", outcome
    model = AccessPredictor.load(registry / "current")
    assert outcome["notified"] is True
    assert after["generation"] == before["generation"] + 1
    assert after["weights_sha256"] == model.metadata.weights_sha256 != before["weights_sha256"]
    REPORT.append(
        f"Mooncake trace ({len(moved)} requests, {cache_tokens} tokens, block 512) through "
        f"vLLM+plugin: vLLM {100 * plugin['vllm_hit_ratio']:.3f}%, replayed log "
        f"{100 * replayed:.3f}%; retrain on the log: {outcome['data']['samples']} samples, "
        f"candidate AUC {outcome['candidate_metrics'].get('roc_auc')}, features "
        f"{', '.join(model.feature_names)}; lpc serve reloaded it (generation "
        f"{before['generation']} -> {after['generation']})"
    )
