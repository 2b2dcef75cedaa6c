"""LPC's metrics in the registry vLLM's own `/metrics` serves, with real vLLM 0.33.0.

Two processes, as in `vllm serve --api-server-count 2` (where vLLM itself sets
`PROMETHEUS_MULTIPROC_DIR`): an engine core builds the LPC scheduler class, serves requests
through its `KVCacheManager` (allocate, then the class's free) and shuts the plugin down; then an API server builds vLLM's `PrometheusStatLogger` for the same
configuration and renders `get_prometheus_registry()` — the registry vLLM's `/metrics`
handler (`attach_router`) serves. LPC's families are there beside vLLM's own, with the same
`model_name` and `engine` labels."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.snippets import run_snippet

pytestmark = pytest.mark.vllm

BUILD = """
import argparse, os, sys
from pathlib import Path
sys.path.insert(0, "scripts")
import vllm_scheduler_replay as replay
args = argparse.Namespace(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=256,
    block_size=16, eviction_policy=None, data_parallel_size=1, data_parallel_rank=0,
    num_blocks=64, scheduler_cls=None, additional_config=None)
model_dir = Path(os.environ["METRICS_TEST_MODEL_DIR"])  # one model for both processes
scheduler, hasher = replay.build_scheduler(args, model_dir)
"""

ENGINE_CORE = (
    """
from lpc.integrations import vllm_plugin
"""
    + BUILD.replace(
        "scheduler_cls=None, additional_config=None",
        "scheduler_cls='lpc.integrations.vllm_scheduler_class.LPCScheduler', "
        'additional_config=\'{"lpc": {"evictor": "lpc-pooled", "metrics_port": 1}}\'',
    )
    + """
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request, RequestStatus
manager = scheduler.kv_cache_manager
for i in range(6):
    tokens = list(range(1000 * i, 1000 * i + 64))
    request = Request(f"r{i}", tokens, SamplingParams(max_tokens=1), None, block_hasher=hasher)
    computed, hits = manager.get_computed_blocks(request)[:2]
    assert manager.allocate_slots(request, len(tokens) - hits, hits, computed) is not None
    request.status = RequestStatus.FINISHED_STOPPED
    scheduler._free_request_blocks(request)  # the class's free path
runtime = vllm_plugin._REGISTRATION.runtime
print("EXPORT", type(vllm_plugin._REGISTRATION.metrics).__name__)
print("RELEASES", runtime.stats.releases)
vllm_plugin.unregister()  # closes the export: its last flush
"""
)

API_SERVER = (
    BUILD
    + """
from prometheus_client import generate_latest
from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.metrics.prometheus import get_prometheus_registry
PrometheusStatLogger(scheduler.vllm_config, [0])
print("MODEL", scheduler.vllm_config.model_config.served_model_name)
print(generate_latest(get_prometheus_registry()).decode())
"""
)


def test_lpc_metrics_are_in_vllms_own_metrics_registry(vllm_python: Path, tmp_path: Path) -> None:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(directory), "METRICS_TEST_MODEL_DIR": str(model_dir)}
    engine = run_snippet(vllm_python, ENGINE_CORE, env)
    assert "EXPORT MetricsFlusher" in engine  # vLLM's route, not the port
    assert "RELEASES 6" in engine
    served = run_snippet(vllm_python, API_SERVER, env)
    assert f"MODEL {model_dir}" in served  # vLLM's served_model_name: the model's path
    labels = f'{{engine="0",model_name="{model_dir}"}}'
    # vLLM's own metric and LPC's, in the one registry vLLM's /metrics serves
    assert f"vllm:prefix_cache_queries_total{labels}" in served
    assert f"vllm:lpc_releases_total{labels} 6.0" in served
    assert "# TYPE vllm:lpc_releases_total counter" in served
    assert f"vllm:lpc_cached_blocks_released_total{labels} 24.0" in served  # 6 x 4 blocks
    memory = [
        line
        for line in served.splitlines()
        if line.startswith('vllm:lpc_memory_bytes{engine="0",model_name="')
        and 'structure="gpu_evictor"' in line
    ]
    assert len(memory) == 1 and float(memory[0].rsplit(" ", 1)[1]) > 0
    assert 'vllm:lpc_free_seconds_count{engine="0"' in served
