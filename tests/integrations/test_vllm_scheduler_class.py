"""LPC through vLLM's own `--scheduler-cls` (`lpc.integrations.vllm_scheduler_class`) on stock
vLLM 0.33.0: nothing patched, one block pool changed.

- The scheduler sample of test_vllm_scheduler_sample.py, vLLM's scheduler class chosen by its
  configuration (`SchedulerConfig.scheduler_cls`) and LPC's settings in `additional_config`:
  `lpc-pooled` evicts unlike LRU, `lpc-const` schedules as stock vLLM at every step (the class
  against the seam, step for step: test_vllm_seam.py).
- Built, the class changes no attribute of vLLM's scheduler, KV cache manager, block pool or
  free queue classes or of their modules, reads no call stack, and another block pool in the
  process keeps vLLM's queue; a bad `lpc` table names the field; on a vLLM of another shape
  the class runs as vLLM's scheduler with one warning.

Marked `vllm` (CI step 3); needs vLLM's venv (`vllm_python`).
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lpc.drivers.scheduler_ab import PARITY_FIELDS, load_requests
from lpc.drivers.vllm_driver import REPO_ROOT
from lpc.drivers.vllm_scheduler import (
    DRIVER,
    PluginSettings,
    PolicyRun,
    first_divergence,
    max_model_len_for,
    parse_policies,
    run_policy,
    write_requests,
)
from tests.integrations.report import REPORT
from tests.integrations.snippets import WATCH_LPC, WATCH_WARNINGS, run_snippet
from tests.integrations.test_vllm_scheduler import SHIPPED_ACCESS_MODEL, sharegpt_like
from tests.integrations.test_vllm_seam import ENGINE

pytestmark = pytest.mark.vllm

SCHEDULER_CLASS = "lpc.integrations.vllm_scheduler_class.LPCScheduler"


def test_the_scheduler_sample_through_the_scheduler_class(
    vllm_python: Path, tmp_path: Path
) -> None:
    """The sample through `LPCScheduler` (the scheduler driver passes `--scheduler-cls` and
    the policy's `--additional-config` table): `lpc-pooled` evicts unlike LRU, with shared
    blocks noted for pooling; `lpc-const` schedules as stock vLLM at every step. The class
    against a second path into vLLM, step for step: test_vllm_seam.py."""
    trace = tmp_path / "chats.jsonl"
    count = sharegpt_like(trace, conversations_count=30, duration_s=40)
    requests, logged, _ = load_requests(str(trace), 1)
    requests_file = write_requests(tmp_path / "requests.jsonl", requests, logged)
    runs = dict(
        zip(
            ("stock lru", "class lpc-const", "class lpc-pooled"),
            parse_policies("lru,lpc-const=0.5,lpc-pooled"),
            strict=True,
        )
    )

    def run(label: str) -> PolicyRun:
        folder = tmp_path / label.replace(" ", "-")
        folder.mkdir()
        return run_policy(
            vllm_python,
            requests_file,
            runs[label],
            ENGINE,
            PluginSettings(),
            folder,
            timeout_s=600,
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(runs, pool.map(run, runs), strict=True))
    stock = done["stock lru"]
    through, through_const = done["class lpc-pooled"], done["class lpc-const"]
    for label, result in done.items():
        assert result.summary["invariants"]["ok"], (label, result.summary["invariants"])
        assert result.totals["finished"] == count, label
    for result in (through, through_const):
        assert result.summary["scheduler"] == SCHEDULER_CLASS
        assert result.summary["invariants"]["queue"] == "LPCSchedulerQueue"
    assert through.summary["plugin_stats"]["config"]["evictor"] == "lpc-pooled"
    assert stock.totals["preemptions"] > 0 and stock.totals["chunked_prefills"] > 0
    stats = through.summary["plugin_stats"]
    assert stats["releases"] == count and stats["preemptions"] > 0
    assert stats["shared_blocks_released"] > 0
    assert through.summary["lru_order_check"]["lpc_not_lru"] > 0, "lpc-pooled evicted as LRU"

    assert through_const.records is not None and stock.records is not None
    divergence = first_divergence(through_const.records, stock.records, PARITY_FIELDS)
    assert divergence is None, f"scheduler class lpc-const vs stock vLLM: {divergence}"
    REPORT.append(
        f"scheduler class ({count} requests, {stock.totals['steps']} scheduler steps, "
        f"{stock.totals['preemptions']} preemptions): lpc-pooled through --scheduler-cls "
        f"{through.totals['prefix_cache_hits']} hit tokens, "
        f"{through.summary['lru_order_check']['lpc_not_lru']} evictions unlike LRU; lpc-const "
        "through it == stock vLLM at every step; nothing patched"
    )


ABORTS = """
import argparse, importlib.util, json, tempfile
from pathlib import Path
spec = importlib.util.spec_from_file_location("driver", "{driver}")
driver = importlib.util.module_from_spec(spec)
spec.loader.exec_module(driver)
table = {{"evictor": "lpc-pooled", "access_model": "{model}", "stats_log_interval_s": 0.0}}
args = argparse.Namespace(
    max_model_len=128, max_num_seqs=4, max_num_batched_tokens=256, block_size=16,
    num_blocks=17, eviction_policy=None, data_parallel_size=1, data_parallel_rank=0,
    scheduler_cls="{cls}", additional_config=json.dumps({{"lpc": table}}),
)
with tempfile.TemporaryDirectory() as folder:
    scheduler, hasher = driver.build_scheduler(args, Path(folder))
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request, RequestStatus
from lpc.integrations import vllm_plugin
for i in range(3):
    params = SamplingParams(max_tokens=4, extra_args={{"lpc_conversation_id": f"c{{i}}"}})
    scheduler.add_request(Request(
        request_id=f"r{{i}}", prompt_token_ids=list(range(100 * i, 100 * i + 40)),
        sampling_params=params, pooling_params=None, arrival_time=0.0, block_hasher=hasher,
    ))
scheduler.schedule()
pool = scheduler.kv_cache_manager.block_pool
print("USED", pool.num_gpu_blocks - 1 - pool.get_num_free_blocks())
aborted = scheduler.finish_requests(["r0", "r1", "r2"], RequestStatus.FINISHED_ABORTED)
stats = vllm_plugin.stats_snapshot()
keys = ("releases", "predictions_in_process", "in_process_scoring_calls", "plugin_errors")
print("ABORTED", len(aborted), json.dumps({{k: stats[k] for k in keys}}))
print("FREE", pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(), scheduler.lpc.held)
"""


def test_aborted_requests_are_scored_in_one_call(vllm_python: Path) -> None:
    """Requests finished from outside the step (`finish_requests`: an abort, usually of
    several at once) are held like a step's and scored in one call, then freed."""
    code = ABORTS.format(
        driver=REPO_ROOT / "scripts" / "vllm_scheduler_replay.py",
        cls=SCHEDULER_CLASS,
        model=SHIPPED_ACCESS_MODEL,
    )
    out = run_snippet(vllm_python, code, {"VLLM_PLUGINS": ""})
    assert "USED 9" in out, out  # three prompts of 40 tokens: 3 blocks each
    stats = json.loads(out.split("ABORTED 3 ", 1)[1].splitlines()[0])
    assert stats == {
        "releases": 3,
        "predictions_in_process": 3,
        "in_process_scoring_calls": 1,
        "plugin_errors": 0,
    }, out
    assert "FREE 0 []" in out, out


# One vLLM process: the class built as vLLM builds it (the scheduler driver's `build_scheduler`),
# a second pool, a bad table, then a vLLM of another shape.
BUILT = (
    """
import argparse, importlib.util, json, logging, sys, tempfile
from pathlib import Path
from vllm.v1.core import block_pool, kv_cache_coordinator, kv_cache_manager, kv_cache_utils
from vllm.v1.core.sched import async_scheduler, scheduler
spec = importlib.util.spec_from_file_location("driver", "{driver}")
driver = importlib.util.module_from_spec(spec)
spec.loader.exec_module(driver)
owners = [
    scheduler.Scheduler, async_scheduler.AsyncScheduler, kv_cache_manager.KVCacheManager,
    block_pool.BlockPool, kv_cache_utils.FreeKVCacheBlockQueue,
    kv_cache_coordinator.UnitaryKVCacheCoordinator, block_pool, kv_cache_utils,
    kv_cache_manager, kv_cache_coordinator, scheduler, async_scheduler,
]
before = [dict(vars(owner)) for owner in owners]
"""
    + WATCH_LPC
    + """

def build(table, cls="{cls}"):
    args = argparse.Namespace(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64, block_size=16,
        num_blocks=9, eviction_policy=None, data_parallel_size=1, data_parallel_rank=0,
        scheduler_cls=cls, additional_config=json.dumps({{"lpc": table}}),
    )
    with tempfile.TemporaryDirectory() as folder:
        return driver.build_scheduler(args, Path(folder))[0]

built = build({{"evictor": "lpc-pooled"}})
built_async = build({{"evictor": "lpc-pooled"}}, "{cls}".replace("LPCScheduler", "LPCAsyncScheduler"))
other = block_pool.BlockPool(8, True, 16)
changed = [
    f"{{getattr(owner, '__name__', owner)}}.{{name}}"
    for owner, old in zip(owners, before)
    for name in set(old) | set(vars(owner))
    if vars(owner).get(name) is not old.get(name)
    # vLLM's own seeding of the prefix hashes (`init_none_hash`, as its engine core does)
    and name not in ("NONE_HASH", "_NONE_HASH_SEED")
]
pool = built.kv_cache_manager.block_pool
from lpc.integrations import vllm_plugin
print("BUILT", type(built).__qualname__, type(pool.free_block_queue).__name__)
async_pool = built_async.kv_cache_manager.block_pool
print("BUILT", type(built_async).__qualname__, type(async_pool.free_block_queue).__name__)
print("FREE", [b.block_id for b in pool.free_block_queue.get_all_free_blocks()])
print("EVICTOR", vllm_plugin.registered_runtime().config.evictor)
print("OTHER", type(other.free_block_queue).__name__)
print("CHANGED", sorted(changed))
print("STACK_READS", stack_reads)
print("WARNINGS", warnings)
STEP = ("schedule", "update_from_output")  # vLLM's, set on the instance where ours has no work
def bound(sched):
    return sorted(n for n in STEP if n in vars(sched) and vars(sched)[n].__func__ is getattr(scheduler.Scheduler, n))
print("BOUND", bound(built), bound(built_async))
vllm_plugin.set_mode("shadow", "test")  # the override feeds the shadow caches
print("BOUND_SHADOW", bound(built), bound(built_async))
vllm_plugin.set_mode("lru", "test")
print("BOUND_LRU", bound(built), bound(built_async))
vllm_plugin.set_mode("lpc", "test")
try:
    build({{"evictor": "lpc-pooled", "scale_per_s": -1}})
    print("BAD_TABLE accepted")
except Exception as error:
    print("BAD_TABLE", type(error).__name__, error)
vllm_plugin.unregister()
with tempfile.TemporaryDirectory() as log_folder:  # the request log notes first schedulings
    logged = build({{"evictor": "lpc-pooled", "request_log_dir": log_folder}})
    print("LOGGED_BOUND", bound(logged))
    vllm_plugin.unregister()
warnings.clear()
from lpc.integrations import vllm_scheduler_class
vllm_scheduler_class.unfit_vllm.cache_clear()  # as in a fresh process
scheduler.Scheduler._drain_deferred_frees = lambda self, fence: None
stock = build({{"evictor": "lpc-pooled"}})
again = build({{"evictor": "lpc-pooled"}})
print("STOCK", type(stock.kv_cache_manager.block_pool.free_block_queue).__name__, stock.lpc)
print("STOCK_BOUND", bound(stock))
print("REGISTERED", vllm_plugin.is_registered())
print("STOCK_WARNINGS", json.dumps(warnings))
"""
)


@pytest.fixture(scope="module")
def built(vllm_python: Path) -> str:
    code = BUILT.format(
        driver=REPO_ROOT / "scripts" / "vllm_scheduler_replay.py", cls=SCHEDULER_CLASS
    )
    return run_snippet(vllm_python, code, {"VLLM_PLUGINS": ""})


def test_the_class_patches_nothing_and_changes_only_its_pool(built: str) -> None:
    assert "BUILT LPCScheduler LPCSchedulerQueue" in built, built
    assert "BUILT LPCAsyncScheduler LPCSchedulerQueue" in built, built
    assert "FREE [1, 2, 3, 4, 5, 6, 7, 8]" in built, built  # vLLM's free list, null block out
    assert "EVICTOR lpc-pooled" in built, built  # from additional_config
    assert "OTHER FreeKVCacheBlockQueue" in built, built
    assert "CHANGED []" in built and "STACK_READS []" in built, built
    assert "WARNINGS []" in built, built
    # No model in process: vLLM's own update on the instance (no frame of ours at each step).
    # No predictor board or request log: vLLM's own `schedule` too, but in shadow mode,
    # where the class's feeds the shadow caches; with a request log, the class's always.
    both = "['schedule', 'update_from_output']"
    assert f"BOUND {both} {both}" in built, built
    assert "BOUND_SHADOW ['update_from_output'] ['update_from_output']" in built, built
    assert f"BOUND_LRU {both} {both}" in built, built
    assert "LOGGED_BOUND ['update_from_output']" in built, built


def test_a_bad_lpc_table_names_the_field(built: str) -> None:
    assert "BAD_TABLE PluginConfigError additional_config['lpc'].scale_per_s" in built, built


def test_a_vllm_of_another_shape_runs_the_class_stock_with_one_warning(built: str) -> None:
    assert "STOCK FreeKVCacheBlockQueue None" in built and "REGISTERED False" in built, built
    assert "STOCK_BOUND ['schedule', 'update_from_output']" in built, built  # nothing of ours
    warnings = json.loads(built.split("STOCK_WARNINGS ", 1)[1].splitlines()[0])
    assert warnings == [
        "LPC scheduler class: vLLM runs its own scheduler, stock: "
        "Scheduler._drain_deferred_frees takes (self, fence), expected (self)"
    ], warnings


OTHER_VERSION = (
    """
import argparse, importlib.util, json, logging, os, tempfile
from pathlib import Path
import vllm
spec = importlib.util.spec_from_file_location("driver", {driver!r})
driver = importlib.util.module_from_spec(spec)
spec.loader.exec_module(driver)
"""
    + WATCH_WARNINGS
    + """
from lpc.integrations import vllm_plugin, vllm_scheduler_class

def build():
    args = argparse.Namespace(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64, block_size=16,
        num_blocks=9, eviction_policy=None, data_parallel_size=1, data_parallel_rank=0,
        scheduler_cls={cls!r}, additional_config=json.dumps({{"lpc": {{}}}}),
    )
    with tempfile.TemporaryDirectory() as folder:
        built = driver.build_scheduler(args, Path(folder))[0]
    return type(built.kv_cache_manager.block_pool.free_block_queue).__name__

vllm.__version__ = "0.33.1"
out = {{"stock": [build(), build()], "registered": vllm_plugin.is_registered()}}
out["stock_warnings"] = list(warnings)
warnings.clear()
vllm_scheduler_class.unfit_vllm.cache_clear()  # as in a fresh process
os.environ["LPC_VLLM_ALLOW_UNTESTED"] = "1"
out["allowed"] = build()
out["allowed_warnings"] = list(warnings)
vllm_plugin.unregister()
print("VERSION", json.dumps(out))
"""
)


def test_an_unverified_vllm_version_runs_the_class_stock_with_one_warning(
    vllm_python: Path,
) -> None:
    """vLLM 0.33.1 (any version but the verified one): the class runs as vLLM's scheduler,
    stock, and says why in one line however many schedulers it builds; never refuses to
    start. `LPC_VLLM_ALLOW_UNTESTED=1` runs LPC on it, said in one line."""
    code = OTHER_VERSION.format(
        driver=str(REPO_ROOT / "scripts" / "vllm_scheduler_replay.py"), cls=SCHEDULER_CLASS
    )
    out = run_snippet(vllm_python, code, {"VLLM_PLUGINS": ""})
    found = json.loads(out.split("VERSION ", 1)[1].splitlines()[0])
    assert found["stock"] == ["FreeKVCacheBlockQueue"] * 2 and not found["registered"], found
    assert found["stock_warnings"] == [
        "LPC scheduler class: vLLM runs its own scheduler, stock: vLLM 0.33.1 is installed; the "
        "LPC plugin is verified with vLLM 0.33.0 only (it reads and overrides vLLM internals "
        "that change between releases); LPC_VLLM_ALLOW_UNTESTED=1 runs LPC on it where every "
        "structural check passes"
    ], found
    assert found["allowed"] == "LPCSchedulerQueue", found
    assert len(found["allowed_warnings"]) == 1, found
    assert "LPC runs anyway (LPC_VLLM_ALLOW_UNTESTED=1" in found["allowed_warnings"][0], found


# A host configured by the LPC_* environment: vLLM loads the plugin (which patches nothing, and
# says in one line where the settings take effect), then builds the class named alone, no
# `lpc` table given.
LPC_HOST = """
import argparse, importlib.util, json, logging, tempfile
from pathlib import Path
from vllm.v1.core import block_pool, kv_cache_manager, kv_cache_utils
from vllm.v1.core.sched import scheduler
spec = importlib.util.spec_from_file_location("driver", DRIVER)
driver = importlib.util.module_from_spec(spec)
spec.loader.exec_module(driver)
owners = [
    scheduler.Scheduler, kv_cache_manager.KVCacheManager, block_pool.BlockPool,
    kv_cache_utils.FreeKVCacheBlockQueue, block_pool,
]
before = [dict(vars(owner)) for owner in owners]
lines = []
class Lines(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
plugin_logger = logging.getLogger("vllm.plugins.lpc")
plugin_logger.addHandler(Lines())
plugin_logger.setLevel(logging.INFO)
from lpc.integrations import vllm_plugin


def build(cls):
    args = argparse.Namespace(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64, block_size=16,
        num_blocks=9, eviction_policy=None, data_parallel_size=1, data_parallel_rank=0,
        scheduler_cls=cls, additional_config="",
    )
    with tempfile.TemporaryDirectory() as folder:
        return driver.build_scheduler(args, Path(folder))[0]


def queue_of(built):
    return type(built.kv_cache_manager.block_pool.free_block_queue).__name__


out = {}
vllm_plugin.register()  # as vLLM's plugin loading calls it
out["registered"] = vllm_plugin.is_registered()
out["recommended"] = [line for line in lines if "--scheduler-cls" in line]
built = build(CLS)
out["queue"] = queue_of(built)
config = vllm_plugin.stats_snapshot()["config"]
out["config"] = [config["evictor"], config["fallback_probability"]]
out["changed"] = sorted(
    f"{getattr(owner, '__name__', owner)}.{name}"
    for owner, old in zip(owners, before)
    for name in set(old) | set(vars(owner))
    if vars(owner).get(name) is not old.get(name) and name not in ("NONE_HASH", "_NONE_HASH_SEED")
)
vllm_plugin.unregister()
print("HOST", json.dumps(out))
"""


def test_an_lpc_environment_host_runs_lpc_by_naming_the_class(vllm_python: Path) -> None:
    """A host configured by `LPC_*`: loading the plugin patches nothing and says so in one
    line naming the class; `--scheduler-cls` alone turns LPC on with the same settings, and
    vLLM's classes stay as they were."""
    driver = REPO_ROOT / "scripts" / "vllm_scheduler_replay.py"
    code = f"DRIVER, CLS = {str(driver)!r}, {SCHEDULER_CLASS!r}\n" + LPC_HOST
    env = {"VLLM_PLUGINS": "", "LPC_EVICTOR": "lpc", "LPC_FALLBACK_P": "0.3"}
    out = json.loads(run_snippet(vllm_python, code, env).split("HOST ", 1)[1].splitlines()[0])
    assert out["registered"] is False and len(out["recommended"]) == 1, out
    assert SCHEDULER_CLASS in out["recommended"][0], out
    assert out["queue"] == "LPCSchedulerQueue", out
    assert out["config"] == ["lpc", 0.3], out
    assert out["changed"] == [], out


def test_the_replay_finds_the_class_s_queue_when_it_starts_off(
    vllm_python: Path, tmp_path: Path
) -> None:
    """Started in `lru`, the pool holds vLLM's own queue from the first pop: the replay finds
    the class's LPC queue among the kill switch's followers (a scheduler's `schedule` follows
    it too) and checks every pop against LRU's order."""
    trace = tmp_path / "chats.jsonl"
    sharegpt_like(trace, conversations_count=6, duration_s=20)
    requests_file = write_requests(tmp_path / "requests.jsonl", load_requests(str(trace), 1)[0])
    summary = tmp_path / "summary.json"
    done = subprocess.run(
        [
            str(vllm_python),
            str(DRIVER),
            *("--requests", str(requests_file.path), "--summary", str(summary)),
            *("--block-size", str(ENGINE.block_size), "--num-blocks", str(ENGINE.num_blocks)),
            *("--max-num-batched-tokens", str(ENGINE.max_num_batched_tokens)),
            *("--max-num-seqs", str(ENGINE.max_num_seqs)),
            *("--max-model-len", str(max_model_len_for(requests_file, ENGINE))),
            *("--step-base-s", repr(ENGINE.step_base_s)),
            *("--step-per-token-s", repr(ENGINE.step_per_token_s)),
            *("--scheduler-cls", SCHEDULER_CLASS),
            *("--additional-config", json.dumps({"lpc": {"mode": "lru"}})),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VLLM_PLUGINS": ""},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(summary.read_text(encoding="utf-8"))
    assert result["plugin_stats"]["mode"] == "lru", result["plugin_stats"]["mode"]
    order = result["lru_order_check"]
    assert order["lru_pops"] > 0 and order["lru_mismatches"] == 0, order
