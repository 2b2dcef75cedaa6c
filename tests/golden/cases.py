"""The golden cases: small slices of the bundled traces, the policies, the sizes, and the
replay that yields their hit tokens (shared by `regenerate.py` and `test_golden.py`).

In libCacheSim's manner (`test/test_evictionAlgo.c` pins each algorithm's misses at several
sizes on one small trace), every policy's prompt hit tokens are pinned at three cache sizes on
a Mooncake slice and a ShareGPT slice, plus a few two-tier pairs; a change of one token fails.
The replay runs `lpc ab`'s own stages in process: the same loading, splitting, fitting
(lpc-turns, the fitted policies, the return curves) and replay grid, without the CLI and the
reports (their plots and intervals cost seconds and pin no hit).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from lpc.replay.ab import ReplayConstants, run_grid
from lpc.replay.ab_options import DATASET_MAX_MODEL_LEN, TRACE_MAX_MODEL_LEN, ABOptions
from lpc.replay.ab_plan import build_workload, dataset_context, load_inputs
from lpc.replay.ab_sources import fit_policy_constants, fit_sources
from lpc.replay.policies import parse_policies
from lpc.replay.simulator import PreparedWorkload, prepare
from lpc.replay.two_tier import TierSettings
from lpc.replay.two_tier_grid import run_pair_grid
from lpc.workload import WorkloadConfig
from tests.lpc.traces.helpers import bundled_lines, write_lines

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).with_name("expected.json")
ACCESS_MODEL = ROOT / "models" / "mooncake-access"  # lpc and lpc-pooled on a trace
TEXT_MODEL = ROOT / "models" / "sharegpt-e5-small-q4"  # lpc and lpc-pooled on chats

# Sizes chosen on the slices so that the policies part ways (at smaller sizes every policy
# holds only the running requests' blocks, at larger ones every policy holds the slice).
MOONCAKE_LINES = 500
MOONCAKE_SIZES = (1_000_000, 2_000_000, 3_000_000)
SHAREGPT_ITEMS = 400
SHAREGPT_SIZES = (4_000, 8_000, 16_000)
SHAREGPT_WORKLOAD = WorkloadConfig(duration_s=600.0, max_active_conversations=20)

# Every registered evictor that needs no model and no rival library, and the replay's
# variants that feed the learned evictors (`lpc.replay.policies`).
HEURISTIC_AND_FITTED = (
    "lru,fifo,lfu,s3fifo,sieve,arc,lhd,sae,wa,session-ref,tlru,sglang-tlru,belady"
)
VARIANTS = "lpc-turns,lpc-const,lpc-const=0.9,oracle,lpc-return-km,lpc-return-true"
RIVALS = "lrb,3l-cache"  # libCacheSim's learned caches (lpc[rivals])
TWO_TIER_GPU = "lru,lpc-pooled"
TWO_TIER_CPU = "lru,lpc-pooled"
TWO_TIER_GPU_SIZE = 2_000_000
TWO_TIER_CPU_SIZES = (1_000_000, 2_000_000)

Table = dict[str, int]  # "policy@size" (or "gpu+cpu@gpu_size+cpu_size:tier") -> hit tokens


@dataclass(frozen=True)
class Case:
    """One pinned table: how to compute it, and whether it needs the rivals or the text
    model (the text model embeds every prompt: seconds, so its case is marked slow)."""

    name: str
    compute: Callable[[Path], Table]
    needs_rivals: bool = False
    slow: bool = False


def mooncake_slice(folder: Path) -> Path:
    return write_lines(folder / "mooncake-slice.jsonl", bundled_lines()[:MOONCAKE_LINES])


def sharegpt_slice(folder: Path) -> Path:
    """The first items of the bundled ShareGPT file, as it holds them (a JSON array)."""
    from training.loaders.sharegpt import bundled_sharegpt_path

    with bundled_sharegpt_path() as path:
        text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    items = []
    while len(items) < SHAREGPT_ITEMS:
        while text[position] in " \r\n\t,":
            position += 1
        item, position = decoder.raw_decode(text, position)
        items.append(item)
    out = folder / "sharegpt-slice.json"
    out.write_text(json.dumps(items), encoding="utf-8")
    return out


@dataclass(frozen=True)
class Replays:
    """A prepared workload, its settings and options: what `lpc ab` replays, built by its own
    stages (`lpc.replay.ab_plan`, `ab_sources`), without its reports (plots, intervals)."""

    workload: PreparedWorkload
    settings: ReplayConstants
    options: ABOptions


def prepared(options: ABOptions, model_factory=None) -> Replays:
    """`run_ab`'s stages up to the replay: load, build, fit the sources and constants, predict."""
    is_trace = options.trace is not None
    options = replace(
        options, max_model_len=TRACE_MAX_MODEL_LEN if is_trace else DATASET_MAX_MODEL_LEN
    )
    quiet = lambda _: None  # noqa: E731
    loaded = load_inputs(options, quiet)
    context = dataset_context(loaded.dataset)
    work = build_workload(loaded, context, quiet)
    replayer = fit_sources(work, context, model_factory)
    fit_policy_constants(loaded, work, context, replayer)
    requests = work.requests
    assert work.options.block_size is not None
    workload = prepare(
        requests,
        work.options.block_size,
        replayer.predictions(requests),
        first_counted=work.first_counted,
        categories=replayer.categories(requests),
        curves=replayer.curves(requests),
    )
    return Replays(workload, replayer.settings_for(requests), work.options)


def _hits(options: ABOptions, model_factory=None) -> Table:
    r = prepared(options, model_factory)
    assert r.options.cache_sizes_tokens is not None
    results = run_grid(r.workload, r.options.policies, r.options.cache_sizes_tokens, r.settings)
    return {f"{x.policy}@{x.cache_tokens}": x.hit_tokens for x in results}


def _access_factory():
    from lpc.access.source import access_source_factory

    return access_source_factory(ACCESS_MODEL, log=lambda _: None)


def _trace_options(folder: Path, policies: str, **extra) -> ABOptions:
    return ABOptions(
        trace=mooncake_slice(folder),
        policies=tuple(parse_policies(policies)),
        cache_sizes_tokens=MOONCAKE_SIZES,
        model_reads_text=False,
        workers=1,
        progress=False,
        out_dir=folder / "out",
        **extra,
    )


def _chat_options(folder: Path, policies: str) -> ABOptions:
    return ABOptions(
        dataset=str(sharegpt_slice(folder)),
        policies=tuple(parse_policies(policies)),
        cache_sizes_tokens=SHAREGPT_SIZES,
        workload=SHAREGPT_WORKLOAD,
        workers=1,
        progress=False,
        out_dir=folder / "out",
    )


def mooncake(folder: Path) -> Table:
    policies = f"{HEURISTIC_AND_FITTED},{VARIANTS},lpc,lpc-pooled,lpc-return-model"
    return _hits(_trace_options(folder, policies), _access_factory())


def sharegpt(folder: Path) -> Table:
    return _hits(_chat_options(folder, f"{HEURISTIC_AND_FITTED},{VARIANTS}"))


def sharegpt_text_model(folder: Path) -> Table:
    from lpc.replay.learned_source import learned_source_factory
    from training.embedding_cache import EmbedOptions

    factory = learned_source_factory(
        TEXT_MODEL, folder / "embeddings", EmbedOptions(progress=False), log=lambda _: None
    )
    return _hits(_chat_options(folder, "lpc,lpc-pooled"), factory)


def rivals(folder: Path) -> Table:
    return _hits(_chat_options(folder, RIVALS))


def two_tier(folder: Path) -> Table:
    """GPU x CPU pairs: each tier's hit tokens (device, host) per pair and size."""
    tiers = TierSettings(TWO_TIER_CPU_SIZES, tuple(parse_policies(TWO_TIER_CPU, cpu_tier=True)))
    options = replace(
        _trace_options(folder, TWO_TIER_GPU, tiers=tiers), cache_sizes_tokens=(TWO_TIER_GPU_SIZE,)
    )
    r = prepared(options, _access_factory())
    grid, _ = run_pair_grid(
        r.workload, r.options.policies, (TWO_TIER_GPU_SIZE,), tiers, r.settings, workers=1
    )
    table: Table = {}
    for r in grid:
        key = f"{r.policy}+{r.offload_policy}@{r.cache_tokens}+{r.offload_tokens}"
        table[f"{key}:device"] = r.device_hit_tokens
        table[f"{key}:host"] = r.host_hit_tokens
    return table


CASES = (
    Case("mooncake", mooncake),
    Case("sharegpt", sharegpt),
    Case("sharegpt-text-model", sharegpt_text_model, slow=True),
    Case("rivals", rivals, needs_rivals=True),
    Case("two-tier", two_tier),
)
