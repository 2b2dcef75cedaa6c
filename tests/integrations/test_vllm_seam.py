"""The plugin through the eviction-policy seam proposed to vLLM (docs/vllm-eviction-seam.patch).

The installed vLLM 0.33.0 package is copied to a temporary folder (its files linked, those the
patch touches copied), the patch is applied with `patch -p1`, and vLLM's python runs with the
patched copy first on its path. There:

- the plugin, configured, registers its queue in vLLM's `EvictionPolicyFactory` and patches
  nothing: every attribute of the classes and modules it used to patch is the original object,
  no LPC code reads the call stack, and only the pool configured with `eviction_policy="lpc"`
  builds the LPC queue;
- the scheduler sample of test_vllm_scheduler_sample.py, through vLLM's own `Scheduler`: with
  `lpc-pooled` every step (hits, evictions through the blocks allocated, preemptions) equals
  the LPC scheduler class's run on stock vLLM (two paths into vLLM, one order), and with
  `lpc-const` every step equals stock vLLM; with the access model in process, the seam
  (scoring each release alone) equals the class (scoring a step's releases in one call);
- a seam of another shape leaves vLLM stock with one warning; the seam needs no version pin.

Marked `vllm` (CI step 3); needs `patch` and vLLM's venv (`vllm_python`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lpc.drivers.scheduler_ab import PARITY_FIELDS, load_requests
from lpc.drivers.vllm_driver import REPO_ROOT
from lpc.drivers.vllm_scheduler import (
    EngineSettings,
    PluginSettings,
    Policy,
    PolicyRun,
    RequestsFile,
    first_divergence,
    parse_policies,
    run_policy,
    write_requests,
)
from tests.integrations.report import REPORT
from tests.integrations.snippets import WATCH_LPC, run_snippet
from tests.integrations.test_vllm_scheduler import SHIPPED_ACCESS_MODEL, sharegpt_like

pytestmark = pytest.mark.vllm

PATCH = REPO_ROOT / "docs" / "vllm-eviction-seam.patch"
# The scheduler sample's engine (test_vllm_scheduler_sample.py): chunked prefills, preemptions.
ENGINE = EngineSettings(
    kv_tokens=2000,
    block_size=16,
    max_num_batched_tokens=256,
    max_num_seqs=16,
    step_base_s=0.010,
    step_per_token_s=1e-4,
    check_every=1,
)


def touched_files(patch: Path) -> list[str]:
    """The files a unified diff changes, relative to its root (`+++ b/PATH`)."""
    text = patch.read_text(encoding="utf-8")
    return re.findall(r"^\+\+\+ b/(\S+)", text, flags=re.MULTILINE)


def patched_copy(package: Path, root: Path, patch: Path) -> Path:
    """`package` (vLLM's folder) under `root`, every file linked but those `patch` changes,
    which are copied; then `patch -p1`. The test fails with patch's output if it does not
    apply."""
    target = root / package.name
    shutil.copytree(
        package,
        target,
        symlinks=True,
        ignore=shutil.ignore_patterns("__pycache__"),
        copy_function=os.symlink,
    )
    for name in touched_files(patch):
        path = root / name
        assert path.is_symlink(), f"{patch.name} changes {name}, which vLLM does not have"
        path.unlink()
        shutil.copyfile(package.parent / name, path)
    done = subprocess.run(
        ["patch", "-p1", "--forward", "--batch", "-i", str(patch)],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"{patch.name} does not apply:\n{done.stdout}{done.stderr}"
    return root


@pytest.fixture(scope="module")
def seam_site(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding vLLM 0.33.0 with the seam patch applied."""
    if shutil.which("patch") is None:
        pytest.fail("the seam test needs GNU patch (apt-get install patch)")
    where = subprocess.run(
        [str(vllm_python), "-c", "import importlib.util as u; print(u.find_spec('vllm').origin)"],
        capture_output=True,
        text=True,
        check=True,
    )
    package = Path(where.stdout.strip()).parent
    return patched_copy(package, tmp_path_factory.mktemp("vllm-seam"), PATCH)


@pytest.fixture(scope="module")
def seam_python(vllm_python: Path, seam_site: Path) -> Path:
    """vLLM's python with the patched copy first on its path (an executable script, so the
    scheduler driver runs it as it runs vLLM's python)."""
    script = seam_site.parent / "python-with-seam"
    script.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{seam_site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{vllm_python}" "$@"\n',
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


NOTHING_PATCHED = (
    """
import logging, sys
import vllm
from vllm.v1.core import block_pool, kv_cache_coordinator, kv_cache_manager, kv_cache_utils
from vllm.v1.core.sched import scheduler
assert "{site}" in block_pool.__file__, block_pool.__file__  # the patched copy
owners = [
    scheduler.Scheduler, kv_cache_manager.KVCacheManager, block_pool.BlockPool,
    kv_cache_utils.FreeKVCacheBlockQueue, kv_cache_coordinator.KVCacheCoordinator,
    kv_cache_coordinator.UnitaryKVCacheCoordinator, block_pool, kv_cache_utils,
    kv_cache_manager, kv_cache_coordinator, scheduler,
]
before = [dict(vars(owner)) for owner in owners]
"""
    + WATCH_LPC
    + """
{alteration}
from lpc.integrations import vllm_plugin
vllm_plugin.register()
vllm_plugin.register()  # vLLM loads plugins more than once per process
changed = [
    f"{{getattr(owner, '__name__', owner)}}.{{name}}"
    for owner, old in zip(owners, before)
    for name in set(old) | set(vars(owner))
    if vars(owner).get(name) is not old.get(name)
]
print("CHANGED", sorted(changed))
print("REGISTERED", vllm_plugin.is_registered())
lpc_pool = block_pool.BlockPool(8, True, 16, eviction_policy="lpc")
stock_pool = block_pool.BlockPool(8, True, 16)
print("LPC_QUEUE", type(lpc_pool.free_block_queue).__name__)
print("STOCK_QUEUE", type(stock_pool.free_block_queue).__name__)
runtime = vllm_plugin.registered_runtime()
print("ENGINE", runtime.queues.engine.hash_block_size if runtime is not None else None)
print("STACK_READS", stack_reads)
print("WARNINGS", warnings)
"""
)


def test_the_plugin_patches_nothing_through_the_seam(seam_python: Path, seam_site: Path) -> None:
    """Configured, the plugin registers its queue and changes no attribute of vLLM; only the
    pool that names `lpc` builds it. The seam is the contract, not the version: a vLLM that
    reports another version but has the seam runs LPC through it, without a warning."""
    code = NOTHING_PATCHED.format(site=seam_site, alteration="vllm.__version__ = '0.34.0'")
    out = run_snippet(seam_python, code, {"LPC_EVICTOR": "lpc-pooled"})
    assert "CHANGED []" in out, out
    assert "REGISTERED True" in out, out
    assert "LPC_QUEUE LPCSeamQueue" in out, out
    assert "STOCK_QUEUE FreeKVCacheBlockQueue" in out, out
    assert "ENGINE 16" in out, out  # the pool's hash block size, handed over by the seam
    assert "STACK_READS []" in out and "WARNINGS []" in out, out


def test_a_seam_of_another_shape_runs_stock_with_one_warning(
    seam_python: Path, seam_site: Path
) -> None:
    alteration = (
        "factory = block_pool.EvictionPolicyFactory\n"
        "factory.register_policy = factory.register_eviction_policy\n"
        "del factory.register_eviction_policy"
    )
    code = NOTHING_PATCHED.format(site=seam_site, alteration=alteration).replace(
        'lpc_pool = block_pool.BlockPool(8, True, 16, eviction_policy="lpc")',
        "lpc_pool = stock_pool = block_pool.BlockPool(8, True, 16)",
    )
    out = run_snippet(seam_python, code, {"LPC_EVICTOR": "lpc-pooled"})
    assert "REGISTERED False" in out and "STOCK_QUEUE FreeKVCacheBlockQueue" in out, out
    assert (
        'WARNINGS ["LPC eviction is off, vLLM runs stock: the LPC plugin does not fit this '
        "vLLM's eviction-policy seam: EvictionPolicyFactory has no register_eviction_policy\"]"
    ) in out, out
    # Only the altered factory changed: the plugin touched nothing.
    assert "CHANGED []" in out, out


def serve(
    requests_file: RequestsFile,
    runs: dict[str, tuple[Path, Policy, str | None]],
    settings: PluginSettings,
    tmp_path: Path,
) -> dict[str, PolicyRun]:
    """Each run (label -> vLLM's python, policy, `CacheConfig.eviction_policy`) over the
    sample, two at a time."""

    def run(label: str) -> PolicyRun:
        python, policy, eviction_policy = runs[label]
        folder = tmp_path / label.replace(" ", "-")
        folder.mkdir()
        return run_policy(
            python,
            requests_file,
            policy,
            ENGINE,
            settings,
            folder,
            eviction_policy=eviction_policy,
            timeout_s=600,
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(runs, pool.map(run, runs), strict=True))


def test_the_scheduler_sample_through_the_seam_equals_the_scheduler_class(
    vllm_python: Path, seam_python: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "chats.jsonl"
    count = sharegpt_like(trace, conversations_count=30, duration_s=40)
    requests, logged, _ = load_requests(str(trace), 1)
    requests_file = write_requests(tmp_path / "requests.jsonl", requests, logged)
    settings = PluginSettings()
    lru, const, pooled = parse_policies("lru,lpc-const=0.5,lpc-pooled")
    runs = {  # label -> (python, policy, CacheConfig.eviction_policy)
        "stock lru": (vllm_python, lru, None),
        "class lpc-pooled": (vllm_python, pooled, None),
        "seam lpc-pooled": (seam_python, pooled, "lpc"),
        "seam lpc-const": (seam_python, const, "lpc"),
    }

    done = serve(requests_file, runs, settings, tmp_path)
    stock, through_class = done["stock lru"], done["class lpc-pooled"]
    seam, seam_const = done["seam lpc-pooled"], done["seam lpc-const"]
    for label, result in done.items():
        assert result.summary["invariants"]["ok"], (label, result.summary["invariants"])
        assert result.totals["finished"] == count, label
    assert through_class.summary["invariants"]["queue"] == "LPCSchedulerQueue"
    assert seam.summary["invariants"]["queue"] == "LPCSeamQueue"
    assert stock.totals["preemptions"] > 0 and stock.totals["chunked_prefills"] > 0

    assert through_class.records is not None and seam.records is not None
    divergence = first_divergence(seam.records, through_class.records, PARITY_FIELDS)
    assert divergence is None, f"seam vs scheduler class (lpc-pooled): {divergence}"
    for key in ("releases", "preemptions", "shared_blocks_released", "cached_blocks_released"):
        assert seam.summary["plugin_stats"][key] == through_class.summary["plugin_stats"][key], key
    assert seam.summary["plugin_stats"]["shared_blocks_released"] > 0
    assert seam.summary["lru_order_check"]["lpc_not_lru"] > 0, "lpc-pooled evicted as LRU"

    assert seam_const.records is not None and stock.records is not None
    divergence = first_divergence(seam_const.records, stock.records, PARITY_FIELDS)
    assert divergence is None, f"seam lpc-const vs stock vLLM: {divergence}"
    REPORT.append(
        f"eviction-policy seam ({count} requests, {stock.totals['steps']} scheduler steps, "
        f"{stock.totals['preemptions']} preemptions): lpc-pooled through the seam == the "
        f"scheduler class at every step ({seam.totals['prefix_cache_hits']} hit tokens, "
        f"{seam.summary['lru_order_check']['lpc_not_lru']} evictions unlike LRU); lpc-const "
        "through the seam == stock vLLM at every step; nothing patched"
    )


def test_with_the_access_model_the_seam_per_release_equals_the_class_per_step(
    vllm_python: Path, seam_python: Path, tmp_path: Path
) -> None:
    """With the access model in process, the scheduler class holds the frees of the requests
    a step finishes until the step's end and scores them in one forward pass; the seam scores
    each release alone at its free. Every step is the same (the p to float32 round-off), and
    the class ran the model once per step that finished a request, fewer times than there
    were releases."""
    trace = tmp_path / "chats.jsonl"
    count = sharegpt_like(trace, conversations_count=30, duration_s=40)
    requests, logged, _ = load_requests(str(trace), 1)
    requests_file = write_requests(tmp_path / "requests.jsonl", requests, logged)
    (pooled,) = parse_policies("lpc-pooled")
    settings = PluginSettings(access_model=SHIPPED_ACCESS_MODEL)

    runs = {"seam": (seam_python, pooled, "lpc"), "class": (vllm_python, pooled, None)}
    done = serve(requests_file, runs, settings, tmp_path)
    seam, through = done["seam"], done["class"]
    for result in (seam, through):
        assert result.summary["invariants"]["ok"], result.summary["invariants"]
        assert result.totals["finished"] == count
    assert through.summary["invariants"]["queue"] == "LPCSchedulerQueue"
    assert seam.summary["invariants"]["queue"] == "LPCSeamQueue"
    assert seam.records is not None and through.records is not None
    divergence = first_divergence(through.records, seam.records, PARITY_FIELDS)
    assert divergence is None, f"class (a call per step) vs seam (per release): {divergence}"
    finished = [
        json.loads(line)["finished"] for line in through.records.read_text().splitlines() if line
    ]
    steps_finishing = sum(1 for n in finished if n)
    assert max(finished) >= 2, "a step that finishes several requests"
    stats, expected = through.summary["plugin_stats"], seam.summary["plugin_stats"]
    for key in ("releases", "predictions_in_process", "preemptions", "evictions"):
        assert stats[key] == expected[key], key
    assert stats["predictions_in_process"] == stats["releases"] == count
    assert expected["in_process_scoring_calls"] == count, "the seam: one per release"
    assert stats["in_process_scoring_calls"] == steps_finishing < count
    REPORT.append(
        f"scheduler class with the access model ({count} requests): every step == the seam's "
        f"(one scoring call per release); {stats['in_process_scoring_calls']} scoring calls "
        f"(one per step that finished a request, up to {max(finished)} a step) for {count} "
        "releases"
    )
