"""The LPC plugin inside real vLLM 0.33.0's KVCacheManager, against stock vLLM and our manager.

Each seed's stream (2,000 operations of multi-tenant multi-turn chat, lpc.difftest.streams) is
replayed by scripts/vllm_plugin_replay.py in vLLM's venv: on stock vLLM, then with the plugin
registered. Requests carry their probability and conversation in `SamplingParams.extra_args`
and the plugin's clock reads the step number, strictly increasing, so two releases never tie.

- parity: with one constant p, vLLM with the plugin equals stock vLLM at every step (block
  tables, hits, evictions, the free queue's order, the cached set);
- agreement: with per-request probabilities and conversations, vLLM with the plugin equals
  our `PrefixCacheBlockManager` + `LPCEvictor` fed the same probabilities, conversations and
  times, at every step — and differs from stock vLLM, or agreement would prove nothing;
- the tie rule: with equal release times, LPC evicts the deeper block first, which LRU does
  not; the plugin still agrees with our manager;
- loading through vLLM's own plugin machinery, refusing an incompatible vLLM, and serving on
  with the fallback p while a predictor on 127.0.0.1 is down or hangs.

Marked `vllm`: `pytest -m vllm tests/integrations` after `bash scripts/setup_vllm_plugin.sh`.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import pytest

from lpc.difftest.checks import first_divergence, replay_totals
from lpc.difftest.ops import OUTCOME_FIELDS, NewRequest, Stream
from lpc.difftest.replay import replay_stream
from lpc.difftest.streams import generate_stream
from lpc.drivers.release_plan import (
    PluginSettings,
    ReleasePlan,
    RequestPlan,
    constant_plan,
    random_plan,
)
from lpc.drivers.vllm_driver import REPO_ROOT, DriverFailed, DriverRun, run_driver
from lpc.drivers.vllm_scheduler import SCHEDULER_CLASS
from lpc.replay.probability import OracleSource
from lpc.traces.lpc_trace import write_trace
from lpc.workload import WorkloadConfig, open_loop_requests
from tests.integrations.fake_predictor import fake_predictor
from tests.integrations.planned import planned_lpc
from tests.integrations.report import REPORT
from tests.integrations.snippets import (
    WATCH_WARNINGS,
    SnippetFailed,
    entry_point_site,
    run_snippet,
    run_vllm_trace_ab,
)
from tests.lpc.synthetic import conversations

pytestmark = pytest.mark.vllm

NUM_SEEDS = int(os.environ.get("LPC_VLLM_PLUGIN_SEEDS", "20"))
STEPS = 2000
SEEDS = range(NUM_SEEDS)
SETTINGS = PluginSettings(scale_per_s=1e-2, fallback_probability=0.5)
CONSTANT_P = 0.7


@pytest.fixture(scope="module")
def streams() -> dict[int, Stream]:
    return {seed: generate_stream(seed) for seed in SEEDS}


def _run(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory, *args, **kwargs) -> DriverRun:
    try:
        return run_driver(
            vllm_python, *args, workdir=tmp_path_factory.mktemp("vllm-plugin"), **kwargs
        )
    except DriverFailed as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def parity_run(vllm_python: Path, streams: dict[int, Stream], tmp_path_factory) -> DriverRun:
    """Stock vLLM and vLLM with the plugin, one constant p, conversations still varied."""
    plans = {s.config.name: constant_plan(s, CONSTANT_P, seed) for seed, s in streams.items()}
    return _run(vllm_python, tmp_path_factory, list(streams.values()), plans, settings=SETTINGS)


@pytest.fixture(scope="module")
def agreement_plans(streams: dict[int, Stream]) -> dict[str, ReleasePlan]:
    return {s.config.name: random_plan(s, seed) for seed, s in streams.items()}


@pytest.fixture(scope="module")
def agreement_run(
    vllm_python: Path, streams: dict[int, Stream], agreement_plans, tmp_path_factory
) -> DriverRun:
    return _run(
        vllm_python, tmp_path_factory, list(streams.values()), agreement_plans, settings=SETTINGS
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_constant_p_is_stock_vllm_step_by_step(
    seed: int, streams: dict[int, Stream], parity_run: DriverRun
) -> None:
    stream = streams[seed]
    name = stream.config.name
    stock, plugin = parity_run.stock[name], parity_run.plugin[name]
    divergence = first_divergence(stream, plugin, stock)
    if divergence is not None:
        pytest.fail(divergence.message("stock vLLM").replace("ours=", "plugin="), pytrace=False)
    totals = replay_totals(stream, stock)
    assert totals.hit_requests > 0 and totals.evictions > 0, "a trivial stream proves nothing"
    summary = parity_run.summary
    REPORT.append(
        f"parity seed {seed:2d} ({stream.config.num_blocks - 1} usable blocks, block size "
        f"{stream.config.block_size}): plugin == stock at all {len(stream.ops)} steps; "
        f"{totals.summary()}; stock {summary['stock_seconds'][name]:.2f}s, "
        f"plugin {summary['plugin_seconds'][name]:.2f}s"
    )


def test_parity_covers_every_release(streams: dict[int, Stream], parity_run: DriverRun) -> None:
    stats = parity_run.summary["plugin_stats"]
    held_frees = sum(1 for s in streams.values() for r in parity_run.stock[s.config.name] if r.held)
    assert stats["releases"] == held_frees
    assert stats["probabilities_from_request"] == held_frees and stats["fallbacks_used"] == 0
    assert stats["shared_blocks_released"] > 0, "max pooling was never exercised"
    REPORT.append(
        f"parity total: {NUM_SEEDS} seeds x {STEPS} steps identical; plugin counted "
        f"{stats['releases']} releases, {stats['evictions']} evictions, "
        f"{stats['shared_blocks_released']} shared-block releases; driver wall "
        f"{parity_run.wall_seconds:.1f}s (vLLM import {parity_run.summary['import_seconds']}s)"
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_per_request_p_matches_our_lpc_manager(
    seed: int,
    streams: dict[int, Stream],
    agreement_plans: dict[str, ReleasePlan],
    agreement_run: DriverRun,
) -> None:
    stream = streams[seed]
    name = stream.config.name
    start = time.perf_counter()
    ours = list(replay_stream(stream, planned_lpc(agreement_plans[name], SETTINGS, stream)))
    our_seconds = time.perf_counter() - start
    divergence = first_divergence(stream, ours, agreement_run.plugin[name])
    if divergence is not None:
        pytest.fail(divergence.message("vLLM+plugin"), pytrace=False)
    totals = replay_totals(stream, ours)
    REPORT.append(
        f"agreement seed {seed:2d}: plugin == our LPC manager at all {len(stream.ops)} steps; "
        f"{totals.summary()}; vLLM+plugin {agreement_run.summary['plugin_seconds'][name]:.2f}s, "
        f"ours {our_seconds:.2f}s"
    )


def test_per_request_p_changes_what_vllm_evicts(
    streams: dict[int, Stream], agreement_run: DriverRun
) -> None:
    """Otherwise agreement with our manager would also hold for a plugin that did nothing."""
    differing = []
    for seed, stream in streams.items():
        name = stream.config.name
        d = first_divergence(
            stream, agreement_run.plugin[name], agreement_run.stock[name], OUTCOME_FIELDS
        )
        if d is not None:
            differing.append((seed, d.step))
    assert len(differing) == len(streams), f"only {differing} differ from stock vLLM"
    stats = agreement_run.summary["plugin_stats"]
    assert stats["fallbacks_used"] > 0 and stats["probabilities_from_request"] > 0
    REPORT.append(
        f"agreement total: {NUM_SEEDS} seeds x {STEPS} steps identical to our manager; every "
        f"seed differs from stock vLLM (first at steps {[step for _, step in differing][:8]}...)"
        f"; p from request {stats['probabilities_from_request']}, fallback "
        f"{stats['fallbacks_used']}"
    )


def test_equal_release_times_break_ties_deepest_first(
    vllm_python: Path, streams: dict[int, Stream], tmp_path_factory
) -> None:
    """Why the parity test's clock strictly increases: at equal keys LPC evicts the deeper
    block first (then the older release), while LRU evicts the earlier release first."""
    seeds = list(SEEDS)[:3]
    chosen = [streams[seed] for seed in seeds]
    plans = {}
    for seed, stream in zip(seeds, chosen, strict=True):
        plan = constant_plan(stream, CONSTANT_P, seed)
        plans[stream.config.name] = ReleasePlan(plan.requests, times=[0.0] * len(stream.ops))
    run = _run(vllm_python, tmp_path_factory, chosen, plans, settings=SETTINGS)
    for stream in chosen:
        name = stream.config.name
        plan = plans[name]
        assert first_divergence(stream, run.plugin[name], run.stock[name]) is not None
        ours = list(replay_stream(stream, planned_lpc(plan, SETTINGS, stream)))
        divergence = first_divergence(stream, ours, run.plugin[name])
        assert divergence is None, divergence.message("vLLM+plugin")


LOAD_AND_BUILD = """
import json, torch
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
    ["layer0"], FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32))])
manager = KVCacheManager(config, max_model_len=64, scheduler_block_size=4, hash_block_size=4,
                         enable_caching=True)
print(json.dumps({"queue": type(manager.block_pool.free_block_queue).__name__}))
"""


def test_vllm_loads_the_plugin_from_its_entry_point(vllm_python: Path, tmp_path: Path) -> None:
    """Loaded by vLLM's own plugin machinery, the plugin patches nothing: installed and loaded
    (`VLLM_PLUGINS` unset: vLLM loads every installed plugin), with or without `LPC_*`
    settings, vLLM keeps its own queue and methods (LPC runs through `--scheduler-cls`)."""
    site = entry_point_site(tmp_path, "vllm.general_plugins")
    stock = {
        "queue": "FreeKVCacheBlockQueue",
        "plugin_loaded": True,
        "registered": False,
        "stock_methods": True,
    }
    configured = {"VLLM_PLUGINS": "lpc", "LPC_MODE": "lpc"}
    loaded = run_snippet(vllm_python, LOAD_AND_BUILD + INSTALLED_CHECK, configured, site)
    assert json.loads(loaded.splitlines()[-1]) == stock
    installed = run_snippet(vllm_python, LOAD_AND_BUILD + INSTALLED_CHECK, extra_path=site)
    assert json.loads(installed.splitlines()[-1]) == stock
    other = run_snippet(vllm_python, LOAD_AND_BUILD, {"VLLM_PLUGINS": "other"}, extra_path=site)
    assert json.loads(other.splitlines()[-1]) == {"queue": "FreeKVCacheBlockQueue"}


INSTALLED_CHECK = """
import sys
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue
from lpc.integrations import vllm_plugin
stock = all(
    getattr(owner, name).__module__.startswith("vllm.")
    for owner, name in (
        (KVCacheManager, "free"), (KVCacheManager, "allocate_slots"),
        (KVCacheManager, "pop_blocks_for_free"), (KVCacheManager, "get_computed_blocks"),
        (BlockPool, "free_blocks"), (BlockPool, "__init__"),
    )
)
print(json.dumps({
    "queue": type(manager.block_pool.free_block_queue).__name__,
    "plugin_loaded": "lpc.integrations.vllm_plugin" in sys.modules,
    "registered": vllm_plugin.is_registered(),
    "stock_methods": stock and manager.block_pool.free_block_queue.__class__ is FreeKVCacheBlockQueue,
}))
"""


ADDITIONAL_CONFIG = """
import json, logging, sys, torch
from pathlib import Path
from vllm.plugins import load_general_plugins
load_general_plugins()
sys.path.insert(0, "scripts")
import vllm_scheduler_replay as driver  # its stand-in model: a ModelConfig without weights
Path(MODEL_DIR).mkdir(parents=True, exist_ok=True)
driver.write_model_config(Path(MODEL_DIR), 64)
driver.register_standin_architecture()
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager
from lpc.integrations import vllm_plugin
from lpc.integrations.config import PluginConfigError
from lpc.integrations.vllm_scheduler_class import LPCScheduler

lines = []
class Lines(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logging.getLogger("vllm.plugins.lpc").addHandler(Lines())
logging.getLogger("vllm.plugins.lpc").setLevel(logging.INFO)  # vLLM's own level when serving

def scheduler(additional, cls=LPCScheduler):
    vllm_config = VllmConfig(
        model_config=ModelConfig(model=MODEL_DIR, skip_tokenizer_init=True, max_model_len=64,
                                 dtype="float32", seed=0),
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64,
                                         max_model_len=64, is_encoder_decoder=False),
        cache_config=CacheConfig(block_size=4, enable_prefix_caching=True),
        device_config=DeviceConfig(device="cpu"),
        additional_config=additional,
    )
    vllm_config.cache_config.num_gpu_blocks = 8
    kv = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer0"], FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1,
                                      dtype=torch.float32))])
    built = cls(vllm_config=vllm_config, kv_cache_config=kv,
                      structured_output_manager=StructuredOutputManager(vllm_config),
                      block_size=4, hash_block_size=4)
    return type(built.kv_cache_manager.block_pool.free_block_queue).__name__

init = Scheduler.__dict__["__init__"]
out = {
    "plain": scheduler({}, Scheduler),
    "table_alone": scheduler({"lpc": {"evictor": "lpc"}}, Scheduler),
    "registered_after_plain": vllm_plugin.is_registered(),
    "scheduler_untouched": Scheduler.__dict__["__init__"] is init,
}
try:
    scheduler({"lpc": {"fallback_probability": 1.5}})
except PluginConfigError as error:
    out["bad"] = str(error)
out["lpc"] = scheduler({"lpc": {"evictor": "lpc", "fallback_probability": 0.3}})
out["config"] = vllm_plugin.stats_snapshot()["config"]["fallback_probability"]
out["logged"] = any("fallback_probability=0.3" in line for line in lines)
vllm_plugin.unregister()
out["after_unregister"] = scheduler({"lpc": {}}, Scheduler)
out["scheduler_untouched_after"] = Scheduler.__dict__["__init__"] is init
print(json.dumps(out))
"""


def test_vllm_s_additional_config_turns_lpc_on_for_that_engine(
    vllm_python: Path, tmp_path: Path
) -> None:
    """`--scheduler-cls …LPCScheduler --additional-config '{"lpc": {...}}'`: that engine runs
    LPC with the table's settings (validated, a bad field named; logged in vLLM's log); with
    the plugin loaded, vLLM's own `Scheduler` is untouched and stays stock, with or without
    the table."""
    site = entry_point_site(tmp_path / "site", "vllm.general_plugins")
    code = ADDITIONAL_CONFIG.replace("MODEL_DIR", repr(str(tmp_path / "model")))
    out = json.loads(run_snippet(vllm_python, code, extra_path=site).splitlines()[-1])
    assert out == {
        "plain": "FreeKVCacheBlockQueue",
        "table_alone": "FreeKVCacheBlockQueue",
        "registered_after_plain": False,
        "scheduler_untouched": True,
        "bad": "additional_config['lpc'].fallback_probability must be in [0, 1], got 1.5",
        "lpc": "LPCSchedulerQueue",
        "config": 0.3,
        "logged": True,
        "after_unregister": "FreeKVCacheBlockQueue",
        "scheduler_untouched_after": True,
    }


def test_a_bad_setting_stops_vllm_with_a_clear_message(vllm_python: Path, tmp_path: Path) -> None:
    """`LPC_*` settings are validated when vLLM loads the plugin, in every process."""
    site = entry_point_site(tmp_path, "vllm.general_plugins")
    with pytest.raises(SnippetFailed) as error:
        run_snippet(
            vllm_python, LOAD_AND_BUILD, {"VLLM_PLUGINS": "lpc", "LPC_FALLBACK_P": "1.5"}, site
        )
    assert "PluginConfigError: LPC_FALLBACK_P='1.5': fallback_probability must be in [0, 1]" in str(
        error.value
    )


CLASS_FROM_ENVIRONMENT = """
import argparse, importlib.util, tempfile
from pathlib import Path
spec = importlib.util.spec_from_file_location("driver", DRIVER)
driver = importlib.util.module_from_spec(spec)
spec.loader.exec_module(driver)
args = argparse.Namespace(
    max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64, block_size=16, num_blocks=9,
    eviction_policy=None, data_parallel_size=1, data_parallel_rank=0, scheduler_cls=CLS,
    additional_config="",
)
with tempfile.TemporaryDirectory() as folder:
    driver.build_scheduler(args, Path(folder))
"""


def test_a_corrupt_access_model_stops_vllm_with_a_clear_message(
    vllm_python: Path, tmp_path: Path
) -> None:
    """The LPC scheduler class loads the configured access model as vLLM builds it: a corrupt
    one stops the engine, naming the setting."""
    import shutil

    corrupt = tmp_path / "corrupt-model"
    shutil.copytree(REPO_ROOT / "models" / "mooncake-access", corrupt)
    (corrupt / "model.safetensors").write_bytes(b"not weights")
    driver = REPO_ROOT / "scripts" / "vllm_scheduler_replay.py"
    code = f"DRIVER, CLS = {str(driver)!r}, {SCHEDULER_CLASS!r}\n" + CLASS_FROM_ENVIRONMENT
    with pytest.raises(SnippetFailed) as error:
        run_snippet(vllm_python, code, {"VLLM_PLUGINS": "", "LPC_ACCESS_MODEL": str(corrupt)})
    assert f"PluginConfigError: LPC_ACCESS_MODEL (access_model) = '{corrupt}'" in str(error.value)
    assert "corrupt" in str(error.value)


LOAD_ON_ALTERED_VLLM = (
    """
import logging
import vllm, vllm.v1.core.kv_cache_utils as utils, vllm.v1.core.block_pool as pool
from lpc.integrations import vllm_plugin
"""
    + WATCH_WARNINGS
    + """{alteration}
vllm_plugin.register()
vllm_plugin.register()  # vLLM loads plugins more than once per process
print("LOADED WARNINGS", len(warnings), vllm_plugin.is_registered())
print("QUEUE", pool.FreeKVCacheBlockQueue.__name__)
"""
)


@pytest.mark.parametrize(
    "alteration",
    [
        "vllm.__version__ = '0.34.0'",
        "utils.FreeKVCacheBlockQueue.pop_lru_n = lambda self, n: None",
        "pool.BlockPool.free_blocks = lambda self, blocks, now: None",
        "import vllm.v1.request as r\n"
        "r.Request.__init__ = lambda self, request_id, sampling_params, **kw: None",
    ],
    ids=["version", "new-queue-method", "changed-signature", "no-prompt-token-count"],
)
def test_loading_on_another_vllm_changes_nothing(vllm_python: Path, alteration: str) -> None:
    """vLLM's plugin loading never stops vLLM and patches nothing, whatever the vLLM, with LPC
    configured by the environment: no warning, no registration, vLLM's own queue. (The
    scheduler class on another vLLM: test_vllm_scheduler_class.py.)"""
    code = LOAD_ON_ALTERED_VLLM.format(alteration=alteration)
    out = run_snippet(vllm_python, code, {"LPC_MODE": "lpc"})
    assert "LOADED WARNINGS 0 False" in out and "QUEUE FreeKVCacheBlockQueue" in out, out


# -- the predictor down, hanging, or answering ---------------------------------------------
PREDICTOR_SEEDS = (0, 1)


def _prompt_plans(streams: dict[int, Stream]) -> dict[str, ReleasePlan]:
    """No probability in the requests: each asks the predictor (it carries user prompts)."""
    return {
        streams[seed].config.name: constant_plan(streams[seed], None, seed, with_prompts=True)
        for seed in PREDICTOR_SEEDS
    }


def _assert_served_like_stock(streams: dict[int, Stream], run: DriverRun) -> int:
    """With every release on the fallback p, the plugin is LRU: vLLM served exactly as stock."""
    held = 0
    for seed in PREDICTOR_SEEDS:
        stream = streams[seed]
        name = stream.config.name
        divergence = first_divergence(stream, run.plugin[name], run.stock[name])
        assert divergence is None, divergence.message("stock vLLM")
        held += sum(1 for r in run.stock[name] if r.held)
    return held


@pytest.mark.parametrize("mode", ["down", "hang"])
def test_vllm_keeps_serving_when_the_predictor_fails(
    mode: str, vllm_python: Path, streams: dict[int, Stream], tmp_path_factory
) -> None:
    with fake_predictor(mode) as (url, seen):
        run = _run(
            vllm_python,
            tmp_path_factory,
            [streams[seed] for seed in PREDICTOR_SEEDS],
            _prompt_plans(streams),
            settings=SETTINGS,
            extra_args=[
                "--predictor-url",
                url,
                "--predictor-timeout-s",
                "0.3",
                "--drain-predictions-s",
                "20",
            ],
        )
    held = _assert_served_like_stock(streams, run)
    stats = run.summary["plugin_stats"]
    client = stats["predictor_client"]
    assert stats["releases"] == held and stats["fallbacks_used"] == held
    assert stats["predictions_used"] == 0 and stats["predictions_requested"] > 0
    assert stats["predictor_failures"] >= 1 and client["failures"] >= 1
    if mode == "down":
        assert client["connection_errors"] >= 1 and seen["requests"] == 0
    else:
        assert client["timeouts"] >= 1 and seen["requests"] >= 1
        # Releases went ahead while predictions were in flight: nothing waited for them.
        assert stats["predictions_late"] > 0
    REPORT.append(
        f"predictor {mode}: {held} releases all on the fallback p, vLLM+plugin == stock vLLM at "
        f"every step; predictions asked {stats['predictions_requested']}, late "
        f"{stats['predictions_late']}, failed calls {stats['predictor_failures']} (client: "
        f"timeouts {client['timeouts']}, connection errors {client['connection_errors']}); "
        f"plugin replay {sum(run.summary['plugin_seconds'].values()):.2f}s"
    )


def _probability_of(conversation_id: str) -> float:
    """The fake predictor's answer for a conversation (the plugin sends it namespaced by
    tenant, `salt=tenant-a/conv-3`: the plan's id is its last part)."""
    plain = conversation_id.rsplit("/", 1)[-1]
    return (0.1, 0.35, 0.6, 0.85, 0.97)[int(plain.split("-")[1]) % 5]


def test_predictions_back_in_time_drive_eviction(
    vllm_python: Path, streams: dict[int, Stream], tmp_path_factory
) -> None:
    """A predictor that answers: the plugin uses its probabilities, exactly as our manager
    fed the same probabilities would; each item carries its request's prompt size."""
    plans = _prompt_plans(streams)
    items: list[dict] = []

    def answer(item: dict) -> float:
        items.append(item)
        return _probability_of(item["conversation_id"])

    with fake_predictor("up", answer) as (url, seen):
        run = _run(
            vllm_python,
            tmp_path_factory,
            [streams[seed] for seed in PREDICTOR_SEEDS],
            plans,
            settings=SETTINGS,
            extra_args=["--predictor-url", url, "--await-predictions-s", "20"],
        )
    stats = run.summary["plugin_stats"]
    assert stats["fallbacks_used"] == 0 and stats["predictions_used"] == stats["releases"] > 0
    assert seen["items"] == stats["predictions_requested"] == len(items)
    # vLLM's Request.num_prompt_tokens, sent as prompt_tokens: the op's prompt length (the
    # prompt text ends with the request id, which the two streams may share).
    prompt_lengths: dict[str, set[int]] = {}
    for seed in PREDICTOR_SEEDS:
        for op in streams[seed].ops:
            if isinstance(op, NewRequest):
                prompt_lengths.setdefault(op.request_id, set()).add(len(op.prompt))
    for item in items:
        request_id = item["user_prompts"][-1].rsplit(" in ", 1)[1]
        assert item["prompt_tokens"] in prompt_lengths[request_id], item
    for seed in PREDICTOR_SEEDS:
        stream = streams[seed]
        name = stream.config.name
        predicted = ReleasePlan(
            {
                rid: RequestPlan(_probability_of(r.conversation_id), r.conversation_id)
                for rid, r in plans[name].requests.items()
            }
        )
        ours = list(replay_stream(stream, planned_lpc(predicted, SETTINGS, stream)))
        divergence = first_divergence(stream, ours, run.plugin[name])
        assert divergence is None, divergence.message("vLLM+plugin")
    REPORT.append(
        f"predictor up: {stats['predictions_used']} releases used predictions "
        f"({seen['requests']} batched calls for {seen['items']} items); vLLM+plugin == our "
        f"manager fed the same probabilities"
    )


# -- end to end: an A/B trace through real vLLM ---------------------------------------------
def test_trace_replay_hit_ratios_agree_with_our_replay(vllm_python: Path, tmp_path: Path) -> None:
    """scripts/vllm_trace_ab.py on a trace written by lpc.traces.lpc_trace.write_trace, with logged
    probabilities (a fifth of them missing: the fallback), at two cache sizes."""
    requests = open_loop_requests(
        conversations(400, seed=5),
        WorkloadConfig(duration_s=900, max_active_conversations=40, seed=3),
    )
    rng = random.Random(1)
    oracle = OracleSource().predict([r.turn for r in requests])
    probabilities = [None if rng.random() < 0.2 else p for p in oracle]
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, requests, {"source": "synthetic chats"}, probabilities)
    for cache_tokens in (6000, 20000):
        result = run_vllm_trace_ab(trace, vllm_python, cache_tokens)
        rows = {row["policy"]: row for row in result["rows"]}
        assert result["agree"]
        for row in rows.values():
            assert abs(row["difference_points"]) <= 0.1
            assert row["vllm_evictions"] > 0, "a cache that never evicts compares nothing"
        assert rows["lpc-trace"]["vllm_hit_ratio"] != rows["lru"]["vllm_hit_ratio"]
        assert result["plugin_stats"]["fallbacks_used"] > 0
        REPORT.append(
            f"trace {result['requests']} requests, {cache_tokens} tokens: "
            + "; ".join(
                f"{p} ours {100 * r['ours_hit_ratio']:.3f}% vLLM {100 * r['vllm_hit_ratio']:.3f}%"
                f" (diff {r['difference_points']:+.4f} pts)"
                for p, r in rows.items()
            )
        )


# -- an access-only model in the plugin's process ---------------------------------------------
SHIPPED_ACCESS_MODEL = REPO_ROOT / "models" / "mooncake-access"


def bundled_trace_sample(path: Path, trace: str, one_in: int, source: str) -> int:
    """Whole conversations of a bundled trace (one in `one_in`, by a stable hash, as
    scripts/sample_conversations.py keeps them), written as a project-format trace."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    from sample_conversations import keep

    from lpc.traces.load import TraceOptions, load_trace

    requests = [
        r for r in load_trace(trace, TraceOptions()).requests if keep(r.conversation_id, one_in)
    ]
    write_trace(path, requests, {"source": f"{source}, one conversation in {one_in}"})
    return len(requests)


def mooncake_sample(path: Path, one_in: int = 40) -> int:
    """The bundled Mooncake conversation trace, one conversation in `one_in`."""
    return bundled_trace_sample(path, "mooncake", one_in, "bundled Mooncake")


def access_model_run(
    trace: Path,
    vllm_python: Path,
    cache_tokens: int,
    requests: int,
    evictor: str = "lpc",
    *extra_args: str,
    timeout_s: float = 600,
) -> tuple[dict[str, dict], dict]:
    """`scripts/vllm_trace_ab.py` on `trace` with the shipped access model predicting every
    release in process (LPC_EVICTOR `evictor`; `extra_args` passed on), checked to evict
    exactly as our replay: equal hit tokens and evictions, every release predicted, no
    fallback, no RPC. Returns the rows by policy and the plugin's counters."""
    result = run_vllm_trace_ab(
        trace,
        vllm_python,
        cache_tokens,
        *("--block-size", "512", "--access-model", str(SHIPPED_ACCESS_MODEL)),
        *("--evictor", evictor, *extra_args),
        timeout_s=timeout_s,
    )
    assert result["requests"] == requests
    rows = {row["policy"]: row for row in result["rows"]}
    plugin = rows[evictor]
    assert plugin["vllm_hit_tokens"] == plugin["ours_hit_tokens"]
    assert plugin["vllm_evictions"] == plugin["ours_evictions"] > 0
    stats = result["plugin_stats"]
    assert stats["predictions_in_process"] == stats["releases"] == requests
    assert stats["fallbacks_used"] == 0 and stats["predictor_calls"] == 0
    return rows, stats


def check_access_model_in_process(
    requests: list,
    trace: Path,
    vllm_python: Path,
    evictor: str,
    cache_tokens: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    timeout_s: float = 600,
) -> dict:
    """vLLM + plugin (LPC_EVICTOR `evictor`) predicting every release of `trace` in process
    with the shipped access model gives our replay's hit ratio exactly, checked three ways,
    from the inside out: the p the plugin used for each release (its request log) equal the
    trace table's p to float noise — the conversations whose turns overlap included, where
    both forms take a request's history from the requests that finished before it; our replay
    fed the plugin's p has vLLM's hit tokens and evictions; and `lpc ab --trace --policies
    <evictor> --model` has them too. The conversation table is sized to hold the hour (at the
    default 50M tokens it evicts conversations on the whole trace, whose next turns then count
    as first turns). Returns the figures the tests report."""
    from lpc.access.source import AccessSource
    from lpc.cli.main import main
    from lpc.replay.policies import PolicySpec
    from lpc.replay.simulator import prepare, replay
    from predictor.access_predictor import AccessPredictor

    logs = tmp_path / "logs"
    rows, stats = access_model_run(
        trace,
        vllm_python,
        cache_tokens,
        len(requests),
        evictor,
        *("--request-log-dir", str(logs), "--conversation-table-max-tokens", "200000000"),
        timeout_s=timeout_s,
    )
    plugin, lru = rows[evictor], rows["lru"]
    assert plugin["vllm_failures"] == 0
    assert lru["vllm_hit_tokens"] == lru["ours_hit_tokens"]
    assert stats["conversations_evicted"] == 0 and stats["conversations_expired"] == 0

    records = [
        json.loads(line)
        for path in sorted(logs.glob("requests-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    logged = {r["request_id"]: r for r in records if "request_id" in r}
    assert len(logged) == len(requests)
    used = [logged[r.request_id]["probability"] for r in requests]
    workload = prepare(requests, 512, {"trace": used})
    fed = replay(workload, PolicySpec(evictor, evictor, "trace"), cache_tokens, 1e-2, 0.5)
    assert (fed.hit_tokens, fed.evictions) == (plugin["vllm_hit_tokens"], plugin["vllm_evictions"])

    code = main(
        [
            *("ab", "--no-progress", "--trace", str(trace), "--split-at", "0"),
            *("--policies", evictor, "--model", str(SHIPPED_ACCESS_MODEL)),
            *("--cache-sizes", str(cache_tokens), "--block-size", "512", "--scale", "0.01"),
            *("--fallback-p", "0.5", "--out", str(tmp_path / "ab"), "--json"),
        ]
    )
    assert code == 0
    replayed = json.loads(capsys.readouterr().out)["comparison"]["hit_ratio"][evictor]
    assert replayed[str(cache_tokens)] == plugin["ours_hit_ratio"] == plugin["vllm_hit_ratio"]

    model_p = AccessSource(AccessPredictor.load(SHIPPED_ACCESS_MODEL)).predict_requests(requests)
    largest_difference = max(abs(a - b) for a, b in zip(model_p, used, strict=True))
    assert largest_difference < 1e-6  # float32 rounding of the batched vs one-request path
    return {
        "plugin": plugin,
        "lru": lru,
        "stats": stats,
        "largest_difference": largest_difference,
        "overlapping": len(overlapping_conversations(requests)),
    }


def report_access_model_in_process(what: str, evictor: str, cache_tokens: int, found: dict) -> str:
    plugin, lru = found["plugin"], found["lru"]
    return (
        f"{evictor} with the access model in process: {what}, {cache_tokens} tokens, block "
        f"512): vLLM+plugin {100 * plugin['vllm_hit_ratio']:.4f}% ({plugin['vllm_hit_tokens']} "
        f"hit tokens, {plugin['vllm_evictions']} evictions) == lpc ab "
        f"{100 * plugin['ours_hit_ratio']:.4f}% == our replay fed the plugin's p; largest p "
        f"difference {found['largest_difference']:.1e} ({found['overlapping']} conversations "
        f"with overlapping turns; LRU {100 * lru['vllm_hit_ratio']:.4f}%); "
        f"{found['stats']['predictions_in_process']} predictions in process"
    )


@pytest.mark.parametrize("evictor", ["lpc", "lpc-pooled"])
def test_access_model_in_process_equals_our_replay_exactly(
    evictor: str, vllm_python: Path, tmp_path: Path, capsys
) -> None:
    """vLLM + plugin predicting every release with the shipped access-only model, from vLLM's
    request state and its conversation table, evicts exactly as `lpc ab --trace --policies
    <evictor> --model` replays it (the features from the trace table) on a Mooncake sample:
    the checks of the whole-trace run below (`engine_trace`), on one conversation in 40."""
    from lpc.traces.lpc_trace import read_trace

    trace = tmp_path / "mooncake-sample.jsonl"
    mooncake_sample(trace)
    requests = read_trace(trace).requests
    cache_tokens = 300_000
    found = check_access_model_in_process(
        requests, trace, vllm_python, evictor, cache_tokens, tmp_path, capsys
    )
    if evictor == "lpc":  # lpc-pooled's trust gate may keep the fallback p on a sample
        assert found["plugin"]["vllm_hit_tokens"] != found["lru"]["vllm_hit_tokens"], (
            "p changed nothing"
        )
    what = f"Mooncake sample ({len(requests)} requests"
    REPORT.append(report_access_model_in_process(what, evictor, cache_tokens, found))


def overlapping_conversations(requests: list) -> set[str]:
    """Conversations with a turn that arrives before the conversation's previous turn has
    finished: the plugin's conversation table records a request when it finishes, so there it
    sees another previous request than the trace table, which goes by arrival."""
    previous_completion_s: dict[str, float] = {}
    overlapping = set()
    for request in requests:
        conversation = request.turn.conversation_id
        if request.arrival_s < previous_completion_s.get(conversation, float("-inf")):
            overlapping.add(conversation)
        previous_completion_s[conversation] = request.completion_s
    return overlapping


@pytest.mark.slow
@pytest.mark.engine_trace
@pytest.mark.parametrize("evictor", ["lpc", "lpc-pooled"])
def test_access_model_in_process_on_the_whole_mooncake_trace(
    evictor: str, vllm_python: Path, tmp_path: Path, capsys
) -> None:
    """The whole bundled Mooncake trace (12,031 requests, 2.5M tokens, block 512) through
    vLLM + plugin predicting every release in process with the shipped access model gives our
    replay's hit ratio exactly (`check_access_model_in_process`; the 21 conversations of the
    hour whose turns overlap included). A documented command (docs/serving.md, `engine_trace`),
    not CI: CI runs the same checks on a sample."""
    from lpc.traces.load import TraceOptions, load_trace

    requests = load_trace("mooncake", TraceOptions()).requests
    trace = tmp_path / "mooncake.jsonl"
    write_trace(trace, requests, {"source": "bundled Mooncake conversation trace"})
    cache_tokens = 2_500_000  # above the trace's peak in-flight tokens: no allocation fails
    assert len(requests) == 12_031
    found = check_access_model_in_process(
        requests, trace, vllm_python, evictor, cache_tokens, tmp_path, capsys, timeout_s=900
    )
    assert found["plugin"]["vllm_hit_tokens"] != found["lru"]["vllm_hit_tokens"], (
        "p changed nothing"
    )
    assert found["overlapping"] == 21
    what = f"whole Mooncake trace ({len(requests)} requests"
    REPORT.append(report_access_model_in_process(what, evictor, cache_tokens, found))


def synthetic_sample(path: Path, one_in: int = 20) -> int:
    """The bundled Mooncake synthetic trace (prefixes shared across conversations), one
    conversation in `one_in`."""
    return bundled_trace_sample(path, "mooncake-synthetic", one_in, "Mooncake synthetic")


def test_pooled_evictor_with_the_access_model_equals_our_replay_exactly(
    vllm_python: Path, tmp_path: Path
) -> None:
    """LPC_EVICTOR=lpc-pooled: vLLM + plugin predicting in process with the shipped access
    model evicts exactly as our `lpc-pooled` replay (equal hit tokens and evictions) on a
    trace whose prefixes are shared across conversations, where it differs from `lpc`."""
    from lpc.access.source import AccessSource
    from lpc.replay.policies import parse_policy
    from lpc.replay.simulator import prepare, replay
    from lpc.traces.lpc_trace import read_trace
    from predictor.access_predictor import AccessPredictor

    trace = tmp_path / "synthetic-sample.jsonl"
    requests = synthetic_sample(trace)
    cache_tokens = 300_000
    rows, _ = access_model_run(trace, vllm_python, cache_tokens, requests, "lpc-pooled")
    plugin = rows["lpc-pooled"]

    replayed = read_trace(trace).requests
    values = AccessSource(AccessPredictor.load(SHIPPED_ACCESS_MODEL)).predict_requests(replayed)
    workload = prepare(replayed, 512, {"model": values})
    plain = replay(workload, parse_policy("lpc"), cache_tokens, 1e-2, 0.5)
    assert plain.hit_tokens != plugin["vllm_hit_tokens"], "the pooled evictor changed nothing"
    REPORT.append(
        f"lpc-pooled in process: Mooncake synthetic sample ({requests} requests, "
        f"{cache_tokens} tokens, block 512): vLLM+plugin {100 * plugin['vllm_hit_ratio']:.4f}% "
        f"== lpc ab {100 * plugin['ours_hit_ratio']:.4f}% (lpc "
        f"{100 * plain.token_hit_ratio:.4f}%, LRU {100 * rows['lru']['vllm_hit_ratio']:.4f}%)"
    )


PROMOTE_MID_TRACE = """
import json, os
from pathlib import Path
import vllm_plugin_replay as driver
import vllm_replay
from lpc.difftest.ops import read_streams
from lpc.integrations import vllm_plugin
from lpc.integrations.config import PluginConfig
from lpc.drivers.release_plan import read_plans

work, registry = Path(os.environ["WORK"]), Path(os.environ["REGISTRY"])
promote_at_s = float(os.environ["PROMOTE_AT_S"])
plans, settings = read_plans(work / "plans.json")
with (work / "streams.jsonl").open() as lines:
    streams = list(read_streams(lines))
vllm = vllm_replay.load_vllm(allow_other_version=False)
clock = driver.StepClock()
plugin = vllm_plugin.install_runtime(
    PluginConfig(
        evictor="lpc",  # compared with our `lpc` replay below
        scale_per_s=settings.scale_per_s,
        fallback_probability=settings.fallback_probability,
        stats_log_interval_s=0.0,
        access_model=str(registry),
        access_model_reload_s=0.0,  # checked below, as the background thread would
    ),
    clock=clock,
)

def before_free():
    # The daily job promotes v0002 while the engine serves: `current` is repointed, and
    # the reload check (the background thread's, every access_model_reload_s) runs now.
    if clock.now >= promote_at_s and os.readlink(registry / "current") != "v0002":
        link = registry / "current.tmp"
        link.symlink_to("v0002")
        link.replace(registry / "current")
        vllm_plugin._REGISTRATION.runtime.access.check_for_promoted_model()

with (work / "plugin.jsonl").open("w") as sink:
    driver.replay(vllm, streams, plans, clock, sink, True, before_free, plugin)
print(json.dumps(vllm_plugin.stats_snapshot()))
vllm_plugin.unregister()
"""


def test_a_model_promoted_mid_trace_is_swapped_in(vllm_python: Path, tmp_path: Path) -> None:
    """A registry's `current` repointed halfway through the Mooncake sample: the plugin in
    real vLLM swaps the new model in at its next reload check (run right after the
    promotion), and evicts exactly as our replay with the old model's p before the promotion
    and the new one's after."""
    from lpc.access.source import AccessSource
    from lpc.difftest.ops import StepRecord, streams_to_jsonl
    from lpc.drivers.release_plan import write_plans
    from lpc.drivers.trace_stream import hit_totals, trace_stream
    from lpc.replay.policies import parse_policy
    from lpc.replay.simulator import prepare, replay
    from lpc.traces.lpc_trace import read_trace
    from predictor.access_predictor import AccessPredictor
    from tests.integrations.access_models import publish

    trace_path = tmp_path / "mooncake-sample.jsonl"
    mooncake_sample(trace_path)
    requests = read_trace(trace_path).requests
    registry = tmp_path / "registry"
    registry.mkdir()
    publish(registry, "v0001")
    publish(registry, "v0002", bias=-4.0)
    (registry / "current").unlink()
    (registry / "current").symlink_to("v0001")
    completions = sorted(r.completion_s for r in requests)
    promote_at_s = completions[len(completions) // 2]

    old, new = (AccessSource(AccessPredictor.load(registry / v)) for v in ("v0001", "v0002"))
    p_old, p_new = old.predict_requests(requests), new.predict_requests(requests)
    mixed = [
        b if r.completion_s >= promote_at_s else a
        for r, a, b in zip(requests, p_old, p_new, strict=True)
    ]
    cache_tokens, block_size = 300_000, 512
    ours = {
        name: replay(
            prepare(requests, block_size, {"model": values}),
            parse_policy("lpc"),
            cache_tokens,
            SETTINGS.scale_per_s,
            SETTINGS.fallback_probability,
        )
        for name, values in (("mixed", mixed), ("old", p_old))
    }
    assert ours["mixed"].hit_tokens != ours["old"].hit_tokens, "the promotion changed nothing"

    workload = prepare(requests, block_size, {"model": mixed})
    stream, plan = trace_stream(workload, cache_tokens, [None] * len(requests))
    (tmp_path / "streams.jsonl").write_text(streams_to_jsonl([stream]), encoding="utf-8")
    write_plans(tmp_path / "plans.json", {stream.config.name: plan}, SETTINGS)
    out = run_snippet(
        vllm_python,
        PROMOTE_MID_TRACE,
        env={
            "WORK": str(tmp_path),
            "REGISTRY": str(registry),
            "PROMOTE_AT_S": repr(promote_at_s),
        },
        extra_path=REPO_ROOT / "scripts",
    )
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["access_model_reloads"] == 1 and stats["access_model_reload_failures"] == 0
    assert stats["access_model_path"].endswith("v0002")
    assert stats["predictions_in_process"] == len(requests)
    with (tmp_path / "plugin.jsonl").open(encoding="utf-8") as lines:
        records = [StepRecord.from_json(line) for line in lines]
    vllm = hit_totals(stream, records)
    assert vllm.hit_tokens == ours["mixed"].hit_tokens
    assert vllm.evictions == ours["mixed"].evictions
    REPORT.append(
        f"promotion mid-trace at {promote_at_s:.0f} s: the plugin swapped v0001 -> v0002 once; "
        f"vLLM hit tokens {vllm.hit_tokens} == our replay with the switch "
        f"(without it: {ours['old'].hit_tokens})"
    )


REGISTER_TWICE = """
import vllm.v1.core.block_pool as pool
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.scheduler import Scheduler
from lpc.integrations import vllm_plugin
stock = (pool.FreeKVCacheBlockQueue, KVCacheManager.free, Scheduler.__init__)
vllm_plugin.register()
vllm_plugin.register()  # vLLM may load plugins more than once per process
assert (pool.FreeKVCacheBlockQueue, KVCacheManager.free, Scheduler.__init__) == stock
print("LOADED, REGISTERED:", vllm_plugin.is_registered())
"""


def test_loading_patches_nothing(vllm_python: Path) -> None:
    """vLLM's plugin loading patches nothing, even with LPC configured by the environment."""
    out = run_snippet(vllm_python, REGISTER_TWICE, {"LPC_MODE": "lpc"})
    assert "LOADED, REGISTERED: False" in out


METRICS_IN_ENGINE = """
import socket, urllib.request, torch
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from lpc.integrations import vllm_plugin
from lpc.integrations.config import PluginConfig
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
url = f"http://127.0.0.1:{port}/metrics"
from lpc.integrations.scheduler_lpc import attach_manager
plugin = vllm_plugin.install_runtime(PluginConfig(metrics_port=port))
try:
    urllib.request.urlopen(url, timeout=5)
    print("SERVED BEFORE ANY POOL")
except OSError:
    print("NOT SERVED BEFORE ANY POOL")
config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
    ["layer0"], FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32))])
manager = KVCacheManager(config, max_model_len=64, scheduler_block_size=4, hash_block_size=4,
                         enable_caching=True)
attach_manager(manager, plugin)  # the pool's LPC queue: this process owns the cache
print(urllib.request.urlopen(url, timeout=5).read().decode())
print("ENGINE", vllm_plugin._REGISTRATION.runtime.queues.engine)
vllm_plugin.unregister()
"""


def test_metrics_are_served_by_the_process_that_owns_the_cache(vllm_python: Path) -> None:
    """vLLM registers plugins in its API server and workers too: only the process that
    builds a block pool (the engine core) may bind the metrics port."""
    out = run_snippet(vllm_python, METRICS_IN_ENGINE)
    assert "NOT SERVED BEFORE ANY POOL" in out
    # vLLM's names and labels; no scheduler built here, so no served model name.
    assert 'vllm:lpc_releases_total{engine="0",model_name=""} 0.0' in out
    assert "vllm:lpc_evictions_total" in out
    # The hash block size read from vLLM's own BlockPool building the queue; no DP rank.
    assert "EngineContext(hash_block_size=4, data_parallel_rank=0, rank_source='default')" in out
