"""The two-tier replay's CPU tier against real vLLM 0.33's `CPUOffloadingManager` on a Mooncake
sample: one conversation in 10 of the bundled trace (1,218 requests, block size 512), GPU
250K tokens (LRU), every request's CPU hit and the chunks stored and evicted compared
exactly, as tests/vllm/test_two_tier_agreement.py (whose helpers these are) does on a
synthetic workload and on the whole trace, in the vLLM CI step.

Marked `vllm`: it runs in CI step 3 (.ci/run), not in the default suite (about 25 s). It
needs vLLM's venv (`.vllm-venv`, or `LPC_VLLM_PYTHON`), which `scripts/bootstrap.sh
--with-vllm` sets up; without it the tests are skipped, loudly (the `vllm_python` fixture,
asked for first so that nothing is loaded before the skip). Every
stream runs through one driver process (vLLM's import, about 10 s, paid once).

- vLLM's built-in policies, CPU 800K tokens, store threshold 0 and 2: `lru` against our `lru`
  (`HostTierPolicy`), `arc` against our `vllm-arc` (`lpc.replay.vllm_arc_policy`, vLLM's
  `ARCCachePolicy` transcribed). Teeth: vLLM's `lru` gives 75 and 24 of the 1,215 requests the
  GPU pool holds (the 3 others reach neither tier) another CPU hit than `arc` (thresholds 0 and
  2).
- LPC's classes, loaded by name and module path with the LPC plugin registered: `lpc` and
  `lpc-pooled` (CPU 200K at threshold 0, 100K at threshold 2, the shipped access model's p)
  and `lpc-return-model` (CPU 800K, thresholds 0 and 2, the shipped return-time model's
  curves), each p or curve reaching the policy through the plugin's release. Teeth: each
  differs from LRU in the CPU tier.
- The transcription itself: `lpc.replay.vllm_arc_policy`'s methods are those of vLLM 0.33.0's
  source, statement for statement.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from lpc.replay.simulator import PreparedWorkload
from tests.integrations.report import REPORT
from tests.vllm.test_two_tier_agreement import (
    LPC_POLICIES,
    RETURN_POLICY,
    Replayed,
    load_mooncake_sample,
    replay_for_vllm,
    require_agreement,
    require_lpc_teeth,
    require_vllm_arc,
    run_driver,
    with_access_model,
    with_return_curves,
)

GPU_TOKENS = 250_000
CPU_TOKENS = 800_000
TRANSCRIPTION = Path(__file__).resolve().parents[2] / "lpc" / "replay" / "vllm_arc_policy.py"

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def mooncake_sample() -> PreparedWorkload:
    return load_mooncake_sample()


def agree(checks: dict[str, Replayed], vllm_python: Path, tmp_path: Path) -> dict[str, dict]:
    """Every check's stream through one driver process; each must agree with vLLM (every
    failing check is reported, not only the first). Returns the outputs by check."""
    outputs = run_driver(vllm_python, tmp_path, [c.stream for c in checks.values()])
    vllm = dict(zip(checks, outputs, strict=True))
    failures = []
    for label, replayed in checks.items():
        try:
            require_agreement(replayed, vllm[label])
        except AssertionError as error:
            failures.append(f"{label}: {error}")
    assert not failures, "\n".join(failures)
    return vllm


def builtin_checks(sample: PreparedWorkload) -> dict[tuple[str, int], Replayed]:
    """vLLM's `lru` and `arc` against our `lru` and `vllm-arc`, thresholds 0 and 2."""
    sizes = (GPU_TOKENS, CPU_TOKENS)
    return {
        (offload, threshold): replay_for_vllm(sample, sizes, threshold, (1000, 1000), offload)
        for offload in ("lru", "vllm-arc")
        for threshold in (0, 2)
    }


def lpc_checks(with_p: PreparedWorkload, with_curves: PreparedWorkload) -> dict[str, Replayed]:
    """`LPCCachePolicy`, `LPCPooledCachePolicy` (CPU tiers small enough that their release
    rules decide some request's CPU hit) and `LPCReturnCachePolicy` against our `lpc`,
    `lpc-pooled` and `lpc-return-model`."""
    checks = {
        f"{offload} {cpu_tokens} threshold {threshold}": replay_for_vllm(
            with_p, (GPU_TOKENS, cpu_tokens), threshold, (500, 1000), offload
        )
        for offload in sorted(LPC_POLICIES)
        for cpu_tokens, threshold in ((200_000, 0), (100_000, 2))
    }
    # With the store threshold the CPU tier holds less; 400K tokens keep it under enough
    # pressure that the return-time order gives some request another CPU hit than LRU's.
    for threshold, cpu_tokens in ((0, CPU_TOKENS), (2, 400_000)):
        checks[f"{RETURN_POLICY} threshold {threshold}"] = replay_for_vllm(
            with_curves, (GPU_TOKENS, cpu_tokens), threshold, (1000, 1000), RETURN_POLICY
        )
    return checks


def require_builtin_teeth(
    checks: dict[tuple[str, int], Replayed], vllm: dict[str, dict]
) -> dict[int, int]:
    """vLLM ran its own `LRUCachePolicy` and `ARCCachePolicy`, and the check has teeth: vLLM's
    lru, on the same requests, GPU hits and finishes, gives some request another CPU hit than
    arc. The number of such requests by threshold."""
    differing = {}
    for threshold in (0, 2):
        lru, arc = checks[("lru", threshold)], checks[("vllm-arc", threshold)]
        assert vllm[f"lru threshold {threshold}"]["policy_class"] == "LRUCachePolicy"
        require_vllm_arc(vllm[f"vllm-arc threshold {threshold}"])
        assert {**lru.stream, "policy": "arc"} == arc.stream
        differing[threshold] = len(arc.differing(vllm[f"lru threshold {threshold}"]["host_blocks"]))
        assert differing[threshold] > 0, f"threshold {threshold}: lru gives arc's CPU hits"
    return differing


def require_lpc_policies(checks: dict[str, Replayed], vllm: dict[str, dict]) -> None:
    """vLLM ran LPC's classes from their module, and each differs from LRU in the CPU tier."""
    for label, replayed in checks.items():
        if replayed.offload in LPC_POLICIES:
            require_lpc_teeth(replayed, vllm[label])
            continue
        assert vllm[label]["policy_class"] == "LPCReturnCachePolicy"
        assert vllm[label]["policy_module"] == "lpc.integrations.vllm_cache_policy"
        assert vllm[label]["plugin_errors"] == 0 and vllm[label]["rekeys"] > 0
        # The return-time order is not LRU's on this sample: some request's CPU hit differs.
        threshold = replayed.stream["store_threshold"]
        sizes = (GPU_TOKENS, replayed.ours.offload_tokens)
        lru = replay_for_vllm(replayed.workload, sizes, threshold, (0, 0), "lru")
        assert lru.differing(vllm[label]["host_blocks"]), label


def test_vllm_manager_agrees_on_a_mooncake_sample(
    vllm_python: Path, mooncake_sample: PreparedWorkload, tmp_path: Path
) -> None:
    """vLLM's built-in policies and LPC's classes in one driver process (vLLM's import, about
    10 s, paid once): every request's CPU hit and the chunks stored and evicted agree."""
    builtin = builtin_checks(mooncake_sample)
    lpc = lpc_checks(with_access_model(mooncake_sample), with_return_curves(mooncake_sample))
    builtin_labels = {f"{offload} threshold {t}": c for (offload, t), c in builtin.items()}
    vllm = agree({**builtin_labels, **lpc}, vllm_python, tmp_path)
    differing = require_builtin_teeth(builtin, vllm)
    require_lpc_policies(lpc, vllm)
    REPORT.append(
        f"two-tier agreement, Mooncake sample ({len(builtin['lru', 0].served)} requests the GPU "
        "pool holds): vLLM's lru and arc == our lru and vllm-arc at store thresholds 0 and 2, "
        f"every CPU hit; vLLM's lru differs from arc on {differing[0]} / {differing[2]} "
        "requests; LPCCachePolicy, LPCPooledCachePolicy and LPCReturnCachePolicy in vLLM's "
        f"manager == our lpc, lpc-pooled and lpc-return-model, every CPU hit, {len(lpc)} checks"
    )


def _methods(tree: ast.Module, class_name: str) -> dict[str, ast.FunctionDef]:
    """The module's functions and `class_name`'s methods, by name."""
    found: dict[str, ast.FunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef) and node.name == class_name:
            found.update((f.name, f) for f in node.body if isinstance(f, ast.FunctionDef))
    return found


def _statements(function: ast.FunctionDef) -> list[str]:
    """Its body without the docstring, each statement dumped (no comments, no positions)."""
    body = function.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        body = body[1:]
    return [ast.dump(statement) for statement in body]


def test_vllm_arc_is_vllms_arc_statement_for_statement(vllm_python: Path) -> None:
    """`lpc.replay.vllm_arc_policy` against vLLM 0.33.0's own files (read, not imported):
    `order_request_keys` and every method of `ARCCachePolicy`, with the hooks it inherits from
    `CachePolicy`, have the same parameters and statements; `__init__` differs only in setting
    `cache_capacity` itself, as `CachePolicy.__init__` does."""
    found = subprocess.run(
        [
            str(vllm_python),
            "-c",
            "import importlib.metadata, importlib.util; "
            "print(importlib.metadata.version('vllm')); "
            "print(importlib.util.find_spec('vllm').submodule_search_locations[0])",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    version, root = found.stdout.split()
    assert version == "0.33.0"
    policies = Path(root) / "v1" / "kv_offload" / "cpu" / "policies"
    base = _methods(ast.parse((policies / "base.py").read_text()), "CachePolicy")
    arc = _methods(ast.parse((policies / "arc.py").read_text()), "ARCCachePolicy")
    vllm = {**base, **arc}  # what ARCCachePolicy runs: its own methods, else CachePolicy's
    ours = _methods(ast.parse(TRANSCRIPTION.read_text()), "ARCCachePolicy")
    concrete = {
        name
        for name, method in base.items()
        if not any(getattr(d, "id", None) == "abstractmethod" for d in method.decorator_list)
    }
    assert set(ours) == set(arc) | concrete
    for name, method in ours.items():
        theirs = vllm[name]
        assert [a.arg for a in method.args.args] == [a.arg for a in theirs.args.args], name
        if name == "__init__":
            # `super().__init__(cache_capacity)`, i.e. CachePolicy's one statement, inlined
            assert _statements(method)[:1] == _statements(base["__init__"]), name
            assert _statements(method)[1:] == _statements(theirs)[1:], name
        else:
            assert _statements(method) == _statements(theirs), name
