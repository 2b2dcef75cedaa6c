"""Is the installed vLLM the one LPC was built against? Checked before it runs there.

The LPC scheduler class (`vllm_scheduler_class`) checks the version (`check_version`, pinned)
and the exact shape of everything it overrides, calls and reads (`scheduler_class_problems`),
and otherwise leaves vLLM stock with one warning line listing every mismatch. A vLLM with the
eviction-policy seam is checked by `seam_problems` instead (no version pin: the seam is the
contract).

Why: docs/design.md, "Checked before it runs".
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

SUPPORTED_VLLM_VERSION = "0.33.0"
ALLOW_UNTESTED_VARIABLE = "LPC_VLLM_ALLOW_UNTESTED"

# The queue methods BlockPool and vLLM's offloading call; the adapter implements exactly these.
QUEUE_METHODS = (
    "popleft",
    "popleft_n",
    "remove",
    "append",
    "append_n",
    "prepend_n",
    "get_all_free_blocks",
    "iter_blocks_after",
)
# (owner, method) -> parameter names (self included) of the vLLM methods LPC calls itself: the
# LPC queue builds vLLM's queue as its list, a drained deferred free frees its blocks, a
# manager driven without a scheduler frees its requests (`scheduler_lpc.ManagerLPC`).
CALLED_SIGNATURES: dict[tuple[str, str], tuple[str, ...]] = {
    ("FreeKVCacheBlockQueue", "__init__"): ("self", "blocks"),
    ("BlockPool", "free_blocks"): ("self", "ordered_blocks"),
    ("KVCacheManager", "free"): ("self", "request"),
}
# The eviction-policy seam's factory methods the plugin calls (`vllm_seam`).
SEAM_FACTORY_METHODS = ("register_eviction_policy", "get_eviction_policy_cls")
BLOCK_FIELDS = ("block_id", "ref_cnt", "pool", "is_null")
BLOCK_PROPERTIES = ("block_hash", "block_hash_num_tokens")
# What the in-process access model reads from a releasing request (`access_runtime`).
ACCESS_REQUEST_FIELDS = ("arrival_time", "prompt_token_ids", "output_token_ids")


def check_version(version: str) -> str | None:
    """None when `version` is the verified one; else the problem, for the one warning line
    (the plugin then leaves vLLM stock unless `ALLOW_UNTESTED_VARIABLE` is 1)."""
    if version == SUPPORTED_VLLM_VERSION:
        return None
    return (
        f"vLLM {version} is installed; the LPC plugin is verified with vLLM "
        f"{SUPPORTED_VLLM_VERSION} only (it reads and overrides vLLM internals that change "
        "between releases)"
    )


def _parameters(function: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


def _vllm(
    block_pool: ModuleType,
    kv_cache_utils: ModuleType,
    kv_cache_manager: ModuleType,
    request_module: ModuleType,
    sampling_params: ModuleType,
    scheduler: ModuleType,
) -> _Vllm:
    return _Vllm(
        block_pool=block_pool,
        kv_cache_utils=kv_cache_utils,
        request_module=request_module,
        sampling_params=sampling_params,
        owners={
            "FreeKVCacheBlockQueue": getattr(kv_cache_utils, "FreeKVCacheBlockQueue", None),
            "BlockPool": getattr(block_pool, "BlockPool", None),
            "KVCacheManager": getattr(kv_cache_manager, "KVCacheManager", None),
            "Scheduler": getattr(scheduler, "Scheduler", None),
        },
    )


@dataclass(frozen=True)
class _Vllm:
    """The vLLM modules checked, and the classes whose methods LPC overrides, calls or reads
    (`owners`, by name; None where vLLM has no such class)."""

    block_pool: ModuleType
    kv_cache_utils: ModuleType
    request_module: ModuleType
    sampling_params: ModuleType
    owners: dict[str, Any]


def _owner_classes(vllm: _Vllm) -> list[str]:
    """The classes LPC overrides, calls or reads exist."""
    return [f"vllm has no {name}" for name, owner in vllm.owners.items() if owner is None]


def _queue_methods(vllm: _Vllm) -> list[str]:
    """The free-block queue's public methods are exactly those the LPC queue implements: it
    replaces vLLM's queue whole, so a method on either side alone means they no longer fit."""
    queue = vllm.owners["FreeKVCacheBlockQueue"]
    if queue is None:
        return []
    public = {
        name for name, value in vars(queue).items() if not name.startswith("_") and callable(value)
    }
    missing = sorted(set(QUEUE_METHODS) - public)
    unknown = sorted(public - set(QUEUE_METHODS))
    problems = []
    if missing:
        problems.append(f"FreeKVCacheBlockQueue lacks {', '.join(missing)}")
    if unknown:
        problems.append(
            f"FreeKVCacheBlockQueue has methods the LPC queue does not implement: "
            f"{', '.join(unknown)}"
        )
    return problems


def _called_signatures(vllm: _Vllm) -> list[str]:
    """Every vLLM method LPC calls itself takes exactly the parameters it passes."""
    problems = []
    for (owner_name, method), expected in CALLED_SIGNATURES.items():
        owner = vllm.owners.get(owner_name)
        function = getattr(owner, method, None) if owner is not None else None
        if function is None:
            problems.append(f"{owner_name}.{method} is missing")
            continue
        actual = _parameters(function)
        if actual != expected:
            problems.append(
                f"{owner_name}.{method} takes ({', '.join(actual)}), expected "
                f"({', '.join(expected)})"
            )
    return problems


def _scheduler_init(vllm: _Vllm) -> list[str]:
    """`Scheduler.__init__` still takes the engine's configuration and the KV cache's first:
    the LPC scheduler class reads them (`engine_checks`) and passes everything through."""
    scheduler = vllm.owners["Scheduler"]
    if scheduler is None:
        return []  # reported by _owner_classes
    leading = _parameters(scheduler.__init__)[:3]
    if leading != ("self", "vllm_config", "kv_cache_config"):
        return [
            f"Scheduler.__init__ starts with ({', '.join(leading)}), expected "
            "(self, vllm_config, kv_cache_config)"
        ]
    return []


def _kv_cache_block(vllm: _Vllm) -> list[str]:
    """The block fields and properties the LPC queue and the plugin read from vLLM's blocks."""
    block = getattr(vllm.kv_cache_utils, "KVCacheBlock", None)
    if block is None:
        return ["vllm has no KVCacheBlock"]
    is_dataclass = dataclasses.is_dataclass(block)
    names = {f.name for f in dataclasses.fields(block)} if is_dataclass else set()
    problems = [f"KVCacheBlock has no field {name}" for name in BLOCK_FIELDS if name not in names]
    problems += [
        f"KVCacheBlock.{name} is not a property"
        for name in BLOCK_PROPERTIES
        if not isinstance(getattr(block, name, None), property)
    ]
    return problems


def _request(vllm: _Vllm) -> list[str]:
    """The request carries its sampling parameters (the per-request hints ride in them) and
    sets the fields sent to the predictor or read by an access model."""
    request = getattr(vllm.request_module, "Request", None)
    if request is None:
        return ["vllm.v1.request.Request no longer takes sampling_params"]
    init_names = getattr(getattr(request.__init__, "__code__", None), "co_names", ())
    problems = []
    if "sampling_params" not in inspect.signature(request).parameters:
        problems.append("vllm.v1.request.Request no longer takes sampling_params")
    elif "num_prompt_tokens" not in init_names:
        problems.append(
            "vllm.v1.request.Request no longer sets num_prompt_tokens (sent to the "
            "predictor as prompt_tokens)"
        )
    problems += [
        f"vllm.v1.request.Request no longer sets {name} (an access model's input)"
        for name in ACCESS_REQUEST_FIELDS
        if name not in init_names
    ]
    return problems


def _sampling_params(vllm: _Vllm) -> list[str]:
    """`SamplingParams` declares `extra_args`, where a request's LPC hints travel."""
    params = getattr(vllm.sampling_params, "SamplingParams", None)
    declared = (
        set(getattr(params, "__struct_fields__", ())) | set(getattr(params, "__annotations__", {}))
        if params is not None
        else set()
    )
    return [] if "extra_args" in declared else ["SamplingParams has no extra_args"]


def _seam(vllm: _Vllm) -> list[str]:
    """The eviction-policy seam (docs/vllm-eviction-seam.patch) has the shape the plugin uses:
    the factory's two class methods, the pool's `eviction_policy`, and a `KVCacheManager.free`
    that calls the policy's `on_request_freed`."""
    factory = getattr(vllm.block_pool, "EvictionPolicyFactory", None)
    if factory is None:
        return ["vllm.v1.core.block_pool has no EvictionPolicyFactory"]
    problems = [
        f"EvictionPolicyFactory has no {name}"
        for name in SEAM_FACTORY_METHODS
        if not callable(getattr(factory, name, None))
    ]
    pool = vllm.owners["BlockPool"]
    if pool is not None and "eviction_policy" not in _parameters(pool.__init__):
        problems.append("BlockPool.__init__ takes no eviction_policy")
    manager = vllm.owners["KVCacheManager"]
    free = getattr(manager, "free", None) if manager is not None else None
    names = getattr(getattr(free, "__code__", None), "co_names", ())
    if free is None or not {"on_request_freed", "_on_request_freed"} & set(names):
        problems.append("KVCacheManager.free does not call the policy's on_request_freed")
    return problems


# Run in this order; a refusal lists the problems in this order.
# What the seam path needs (no class replaced, no method wrapped): the seam itself, and the
# queue, block, request and sampling-parameter shapes the LPC queue and its release read.
SEAM_CHECKS: tuple[Callable[[_Vllm], list[str]], ...] = (
    _owner_classes,
    _queue_methods,
    _seam,
    _kv_cache_block,
    _request,
    _sampling_params,
)


def has_seam(block_pool: ModuleType) -> bool:
    """Does this vLLM publish the eviction-policy seam (`EvictionPolicyFactory` in its block
    pool module)? Then the plugin registers its queue there and patches nothing."""
    return getattr(block_pool, "EvictionPolicyFactory", None) is not None


def seam_problems(
    block_pool: ModuleType,
    kv_cache_utils: ModuleType,
    kv_cache_manager: ModuleType,
    request_module: ModuleType,
    sampling_params: ModuleType,
    scheduler: ModuleType,
) -> list[str]:
    """Every mismatch between this vLLM's seam and what the seam path expects (`SEAM_CHECKS`).
    No version pin: the seam is the contract, so any vLLM that has it in this shape fits."""
    vllm = _vllm(
        block_pool, kv_cache_utils, kv_cache_manager, request_module, sampling_params, scheduler
    )
    return [problem for check in SEAM_CHECKS for problem in check(vllm)]


# The LPC scheduler class (`vllm_scheduler_class`): the `Scheduler` methods it overrides or
# calls, with their parameters (self included), and what vLLM's constructors set that it reads.
SCHEDULER_CLASS_SIGNATURES: dict[str, tuple[str, ...]] = {
    "_free_request_blocks": ("self", "request"),
    "_request_blocks_can_be_freed": ("self", "request"),
    "_drain_deferred_frees": ("self",),
    "_update_waiting_for_remote_kv": ("self", "request"),
    "update_from_output": ("self", "scheduler_output", "model_runner_output"),
    "finish_requests": ("self", "request_ids", "finished_status"),
    "schedule": ("self", "throttle_prefills"),
}
SCHEDULER_INIT_NAMES = (
    "kv_cache_manager",
    "deferred_frees",
    "processed_step_seq",
    "failed_recving_kv_req_ids",
    "requests",
)
# The names vLLM's own code of these methods reads: the class runs the drain itself (each free
# with its release), and announces the free a failed load makes, on the condition vLLM frees.
SCHEDULER_METHOD_NAMES: dict[str, frozenset[str]] = {
    "_drain_deferred_frees": frozenset(
        ("deferred_frees", "processed_step_seq", "popleft", "block_pool", "free_blocks")
    ),
    "_update_waiting_for_remote_kv": frozenset(
        ("failed_recving_kv_req_ids", "num_computed_tokens", "free")
    ),
}
BLOCK_POOL_INIT_NAMES = ("blocks", "free_block_queue", "null_block")
# What its `schedule()` reads from vLLM's output: the requests scheduled for the first time.
SCHEDULER_OUTPUT_FIELDS = {
    "SchedulerOutput": "scheduled_new_reqs",
    "NewRequestData": "req_id",
    "CachedRequestData": "req_ids",
}


def _code_names(function: Any) -> tuple[str, ...]:
    """The global and attribute names `function`'s own code uses (through any wrapper)."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    return code.co_names if code is not None else ()


def _scheduler_class(vllm: _Vllm) -> list[str]:
    """The `Scheduler` methods the LPC scheduler class overrides or calls take exactly the
    parameters it passes, `schedule` exists, the methods whose frees it carries still read
    what it expects, and the constructors still set what it reads."""
    scheduler = vllm.owners["Scheduler"]
    problems = []
    if scheduler is not None:
        for method, expected in SCHEDULER_CLASS_SIGNATURES.items():
            function = getattr(scheduler, method, None)
            if function is None:
                problems.append(f"Scheduler.{method} is missing")
            elif _parameters(function) != expected:
                problems.append(
                    f"Scheduler.{method} takes ({', '.join(_parameters(function))}), expected "
                    f"({', '.join(expected)})"
                )
        for method, expected_names in SCHEDULER_METHOD_NAMES.items():
            function = getattr(scheduler, method, None)
            if function is None or _parameters(function) != SCHEDULER_CLASS_SIGNATURES[method]:
                continue  # reported above
            missing = sorted(expected_names - set(_code_names(function)))
            if missing:
                problems.append(f"Scheduler.{method} no longer reads {', '.join(missing)}")
        names = _code_names(scheduler.__init__)
        problems += [
            f"Scheduler.__init__ no longer sets self.{name}"
            for name in SCHEDULER_INIT_NAMES
            if name not in names
        ]
    pool = vllm.owners["BlockPool"]
    if pool is not None:
        names = _code_names(pool.__init__)
        problems += [
            f"BlockPool.__init__ no longer sets self.{name}"
            for name in BLOCK_POOL_INIT_NAMES
            if name not in names
        ]
    return problems


def _scheduler_output(output: ModuleType) -> list[str]:
    """The output fields the LPC scheduler class's `schedule()` reads."""
    problems = []
    for owner_name, field in SCHEDULER_OUTPUT_FIELDS.items():
        owner = getattr(output, owner_name, None)
        names = (
            {f.name for f in dataclasses.fields(owner)}
            if owner is not None and dataclasses.is_dataclass(owner)
            else set()
        )
        if field not in names:
            problems.append(f"vllm.v1.core.sched.output.{owner_name} has no field {field}")
    return problems


# What the LPC scheduler class needs (no class replaced, no method wrapped): the methods it
# overrides, and the queue, block, request and sampling-parameter shapes its queue reads.
SCHEDULER_CLASS_CHECKS: tuple[Callable[[_Vllm], list[str]], ...] = (
    _owner_classes,
    _queue_methods,
    _called_signatures,
    _scheduler_init,
    _scheduler_class,
    _kv_cache_block,
    _request,
    _sampling_params,
)


def scheduler_class_problems(
    block_pool: ModuleType,
    kv_cache_utils: ModuleType,
    kv_cache_manager: ModuleType,
    request_module: ModuleType,
    sampling_params: ModuleType,
    scheduler: ModuleType,
    scheduler_output: ModuleType,
) -> list[str]:
    """Every mismatch between this vLLM and what the LPC scheduler class expects
    (`SCHEDULER_CLASS_CHECKS`, then the scheduler output's fields). The version is checked
    beside it (`check_version`, in `vllm_scheduler_class.unfit_vllm`)."""
    vllm = _vllm(
        block_pool, kv_cache_utils, kv_cache_manager, request_module, sampling_params, scheduler
    )
    problems = [problem for check in SCHEDULER_CLASS_CHECKS for problem in check(vllm)]
    return problems + _scheduler_output(scheduler_output)


def scheduler_instance_problems(scheduler: Any, free_queue_class: type) -> list[str]:
    """What the LPC scheduler class reads from a built scheduler: its KV cache manager's
    coordinator (`get_blocks`) and block pool (its blocks, in id order, and vLLM's own free
    queue), and the deferred frees."""
    problems = []
    manager = getattr(scheduler, "kv_cache_manager", None)
    coordinator = getattr(manager, "coordinator", None)
    if not callable(getattr(coordinator, "get_blocks", None)):
        problems.append("the KV cache manager's coordinator has no get_blocks")
    pool = getattr(manager, "block_pool", None)
    blocks = getattr(pool, "blocks", None)
    if not isinstance(blocks, list) or not blocks:
        problems.append("the block pool has no list of blocks")
    if type(getattr(pool, "free_block_queue", None)) is not free_queue_class:
        problems.append("the block pool's free queue is not vLLM's FreeKVCacheBlockQueue")
    if getattr(pool, "null_block", None) is None:
        problems.append("the block pool has no null block")
    if not hasattr(getattr(scheduler, "deferred_frees", None), "__len__"):
        problems.append("the scheduler has no deferred frees")
    return problems
