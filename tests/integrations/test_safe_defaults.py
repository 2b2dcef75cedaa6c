"""Safe defaults: the plugin's evictor is the trust-gated `lpc-pooled`, and its horizon is the
loaded access model's label horizon (from the artifact's metadata), else 180 s.

`build_runtime` is what a registration sets up before vLLM builds anything, so these run
without vLLM; the `vllm`-marked test at the end checks the same on vLLM's own `KVCacheManager`
in vLLM's venv (its pool given the scheduler class's queue).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from eviction import LPCEvictor, PooledLPCEvictor
from lpc.integrations.config import PluginConfig, PluginConfigError, load_config
from lpc.integrations.vllm_plugin import build_runtime
from lpc.integrations.vllm_queue import bind_queue_class
from tests.integrations.access_models import SHIPPED
from tests.integrations.snippets import run_snippet


@dataclass
class Block:
    block_id: int
    block_hash: bytes | None = None
    block_hash_num_tokens: int | None = None


def evictor_of(config: PluginConfig) -> LPCEvictor:
    runtime = build_runtime(config, clock=lambda: 0.0)
    return bind_queue_class(runtime.queues)([Block(i) for i in range(8)]).evictor


def model_with_horizon(tmp_path: Path, horizon: float | None) -> Path:
    folder = tmp_path / f"model-{horizon}"
    shutil.copytree(SHIPPED, folder)
    meta = json.loads((folder / "metadata.json").read_text())
    meta["inputs"]["horizon_s"] = horizon
    (folder / "metadata.json").write_text(json.dumps(meta))
    return folder


def test_the_default_evictor_is_the_trust_gated_pooled_one() -> None:
    assert load_config({}).evictor == PluginConfig().evictor == "lpc-pooled"
    evictor = evictor_of(PluginConfig())
    assert isinstance(evictor, PooledLPCEvictor)
    assert evictor.model_min_labels == 100 and not evictor.model_trusted
    assert (evictor.horizon_s, evictor.memory_window_s) == (180.0, 600.0), "today's constants"
    assert evictor.memory == "chains", "the rule chose the memory by chain"
    assert type(evictor_of(PluginConfig(evictor="lpc"))) is LPCEvictor
    assert evictor_of(PluginConfig(pooled_memory="blocks")).memory == "blocks"
    assert evictor_of(PluginConfig(pooled_memory="content")).memory == "content"


def test_the_horizon_comes_from_the_loaded_access_model(tmp_path: Path) -> None:
    shipped = evictor_of(PluginConfig(access_model=str(SHIPPED)))
    assert shipped.horizon_s == 180.0  # the shipped artifact records 180 s
    folder = model_with_horizon(tmp_path, 900.0)
    runtime = build_runtime(PluginConfig(access_model=str(folder)), clock=lambda: 0.0)
    assert runtime.queues.evictor_horizon_s == 900.0
    evictor = bind_queue_class(runtime.queues)([Block(i) for i in range(8)]).evictor
    assert isinstance(evictor, PooledLPCEvictor)
    assert evictor.horizon_s == 900.0
    assert evictor.memory_window_s == 900.0, "the memory must outlast the horizon"
    short = evictor_of(PluginConfig(access_model=str(model_with_horizon(tmp_path, 60.0))))
    assert (short.horizon_s, short.memory_window_s) == (60.0, 600.0)


def test_a_model_without_a_horizon_keeps_the_default(tmp_path: Path) -> None:
    folder = model_with_horizon(tmp_path, None)
    evictor = evictor_of(PluginConfig(access_model=str(folder)))
    assert evictor.horizon_s == 180.0


@pytest.mark.parametrize("horizon", [math.nan, -5.0, 0.0])
def test_a_model_with_a_broken_horizon_is_refused_naming_the_field(
    horizon: float, tmp_path: Path
) -> None:
    """A recorded horizon that is not a positive number is a damaged artifact: the shared
    artifact check refuses it at start-up, as `lpc ab` and `lpc models check` do."""
    folder = model_with_horizon(tmp_path, horizon)
    with pytest.raises(PluginConfigError, match=r"LPC_ACCESS_MODEL.*inputs\.horizon_s must be"):
        evictor_of(PluginConfig(access_model=str(folder)))


def test_plain_lpc_has_no_horizon() -> None:
    runtime = build_runtime(PluginConfig(evictor="lpc", access_model=str(SHIPPED)))
    assert runtime.queues.evictor_horizon_s is None


def test_a_promoted_model_with_another_horizon_is_used_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    shutil.copytree(SHIPPED, registry / "v0001")
    (registry / "current").symlink_to("v0001")
    now = [0.0]
    runtime = build_runtime(
        PluginConfig(access_model=str(registry), access_model_reload_s=1.0),
        clock=lambda: now[0],
    )
    access = runtime.access
    assert access is not None
    shutil.copytree(model_with_horizon(tmp_path, 600.0), registry / "v0002")
    link = registry / "current.tmp"
    link.symlink_to("v0002")
    link.replace(registry / "current")
    now[0] = 5.0
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.lpc"):
        access.check_for_promoted_model()
    assert access.pointer[0].endswith("v0002") and access.horizon_s == 600.0
    assert runtime.queues.horizon_s == 180.0, "the evictor keeps its horizon until a restart"
    assert any("label horizon 600.0 s" in r.getMessage() for r in caplog.records)


def test_the_fallback_p_stays_a_setting_and_the_base_rate_is_pointed_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="vllm.plugins.lpc"):
        runtime = build_runtime(PluginConfig(access_model=str(SHIPPED)))
    assert runtime.queues.config.fallback_probability == 0.5
    assert any("training base rate is 0.267" in r.getMessage() for r in caplog.records)


DEFAULTS_IN_VLLM = """
import json, torch
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from lpc.integrations import vllm_plugin
from lpc.integrations.config import load_config
from lpc.integrations.scheduler_lpc import attach_manager
plugin = vllm_plugin.install_runtime(load_config({"LPC_ACCESS_MODEL": %r}))
config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
    ["layer0"], FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32))])
manager = KVCacheManager(config, max_model_len=64, scheduler_block_size=4, hash_block_size=4,
                         enable_caching=True)
attach_manager(manager, plugin)
evictor = manager.block_pool.free_block_queue.evictor
snapshot = vllm_plugin.stats_snapshot()
print(json.dumps({"evictor": evictor.name, "horizon_s": evictor.horizon_s,
                  "snapshot_horizon_s": snapshot["evictor_horizon_s"],
                  "counters": [snapshot["invalid_probabilities"], snapshot["plugin_errors"]]}))
vllm_plugin.unregister()
"""


@pytest.mark.vllm
def test_vllm_with_the_plugin_defaults_to_the_pooled_evictor_on_the_models_horizon(
    vllm_python: Path, tmp_path: Path
) -> None:
    folder = model_with_horizon(tmp_path, 240.0)
    out = run_snippet(vllm_python, DEFAULTS_IN_VLLM % str(folder))
    assert json.loads(out.strip().splitlines()[-1]) == {
        "evictor": "lpc-pooled",
        "horizon_s": 240.0,
        "snapshot_horizon_s": 240.0,
        "counters": [0, 0],
    }
