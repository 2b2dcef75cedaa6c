"""Replay an operation stream on real vLLM (0.33.0) and print one JSON record per step.

Runs INSIDE the vLLM venv (`scripts/setup_vllm_venv.sh`); the differential test
(`tests/vllm/test_differential.py`) runs it as a subprocess and compares its records with our
block manager's. It imports vLLM, the standard library and `lpc.difftest.ops` (standard library
only), nothing else of ours.

Input (stdin or --input): JSON lines as written by `lpc.difftest.ops.streams_to_jsonl`; every
`config` record starts a fresh `KVCacheManager`. Output (stdout or --output): one
`StepRecord` JSON line per record, the config included (step 0, the initial free queue).

Each request is driven the way vLLM's scheduler drives a new request, with its whole output
known in advance (our manager's one-shot API): a `Request` is built with the prompt,
`get_computed_blocks` looks the prompt up, the output tokens are appended (so the request's
block hashes cover them), then `allocate_slots` allocates and caches every full block of prompt
and output at once; `free` finishes the request. Evicted blocks are observed exactly by
wrapping `BlockPool._maybe_evict_cached_block` and cross-checked against the hashes the new
blocks held before the allocation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lpc.difftest.ops import (
    FreeRequest,
    NewRequest,
    StepRecord,
    Stream,
    StreamStart,
    read_streams,
)

EXPECTED_VLLM_VERSION = "0.33.0"
# Large enough that vLLM never clamps a request to it; the streams stay far below.
MAX_MODEL_LEN = 1 << 20


class DriverError(RuntimeError):
    """The replay could not be carried out faithfully."""


class VllmReplay:
    """One stream on one fresh `KVCacheManager` with a single full-attention group."""

    def __init__(self, vllm: Any, config: StreamStart) -> None:
        self.v = vllm
        self.config = config
        kv_cache_config = vllm.KVCacheConfig(
            num_blocks=config.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                vllm.KVCacheGroupSpec(
                    ["layer0"],
                    vllm.FullAttentionSpec(
                        block_size=config.block_size,
                        num_kv_heads=1,
                        head_size=1,
                        dtype=vllm.torch.float32,
                    ),
                )
            ],
        )
        self.manager = vllm.KVCacheManager(
            kv_cache_config,
            max_model_len=MAX_MODEL_LEN,
            scheduler_block_size=config.block_size,
            hash_block_size=config.block_size,
            enable_caching=True,
        )
        self.pool = self.manager.block_pool
        self.hasher = vllm.get_request_block_hasher(config.block_size, vllm.hash_fn)
        self.requests: dict[str, Any] = {}
        self._evicted: list[int] = []
        original = self.pool._maybe_evict_cached_block

        def observed(block: Any) -> bool:
            evicted = original(block)
            if evicted:
                self._evicted.append(block.block_id)
            return evicted

        # An instance attribute shadows the method for this pool only.
        self.pool._maybe_evict_cached_block = observed

    def run(self, ops: Iterable[NewRequest | FreeRequest]) -> Iterator[StepRecord]:
        yield self._record(0, "config", None, None, None, (), None)
        for step, op in enumerate(ops, 1):
            if isinstance(op, NewRequest):
                yield self._new(step, op)
            elif isinstance(op, FreeRequest):
                yield self._free(step, op)
            else:  # pragma: no cover - read_streams yields only these two operations
                raise DriverError(f"unexpected operation {op!r}")

    def _new(self, step: int, op: NewRequest) -> StepRecord:
        v = self.v
        if op.request_id in self.requests:
            raise DriverError(f"step {step}: request {op.request_id!r} is already running")
        if op.num_tokens > MAX_MODEL_LEN:
            raise DriverError(f"step {step}: {op.num_tokens} tokens exceed {MAX_MODEL_LEN}")
        request = v.Request(
            request_id=op.request_id,
            prompt_token_ids=list(op.prompt),
            sampling_params=v.SamplingParams(max_tokens=max(1, len(op.output))),
            pooling_params=None,
            arrival_time=float(step),
            cache_salt=op.cache_salt,
            block_hasher=self.hasher,
        )
        computed, hit_tokens, _ = self.manager.get_computed_blocks(request)
        if op.output:
            request.append_output_token_ids(list(op.output))
        hashes_before = [b.block_hash for b in self.pool.blocks]
        self._evicted.clear()
        new_blocks = self.manager.allocate_slots(
            request,
            num_new_tokens=request.num_tokens - hit_tokens,
            num_new_computed_tokens=hit_tokens,
            new_computed_blocks=computed,
        )
        evicted = tuple(self._evicted)
        if new_blocks is None:
            if evicted:
                raise DriverError(f"step {step}: a failed allocation evicted {evicted}")
            return self._record(step, "new", op.request_id, hit_tokens, None, (), None)
        request.status = v.RequestStatus.RUNNING
        self.requests[op.request_id] = request
        self._admitted(request, hit_tokens)
        (table,) = self.manager.get_block_ids(op.request_id)
        hit_blocks = computed.get_block_ids()[0]
        fresh = table[len(hit_blocks) :]
        if table[: len(hit_blocks)] != hit_blocks:
            raise DriverError(f"step {step}: block table {table} does not start with {hit_blocks}")
        # Cross-check: exactly the fresh blocks that held a hash were evicted, in pop order.
        had_hash = tuple(b for b in fresh if hashes_before[b] is not None)
        if had_hash != evicted:
            raise DriverError(
                f"step {step}: observed evictions {evicted} but fresh blocks with a hash {had_hash}"
            )
        return self._record(step, "new", op.request_id, hit_tokens, tuple(table), evicted, None)

    def _free(self, step: int, op: FreeRequest) -> StepRecord:
        request = self.requests.pop(op.request_id, None)
        if request is not None:
            request.status = self.v.RequestStatus.FINISHED_STOPPED
            self._free_request(request)
        return self._record(step, "free", op.request_id, None, None, (), request is not None)

    def _admitted(self, request: Any, hit_tokens: int) -> None:
        """A request's first scheduling, allocated with a prefix hit of `hit_tokens`: what a
        scheduler notes then (nothing here; a subclass with an eviction plugin)."""

    def _free_request(self, request: Any) -> None:
        """The scheduler's free of a finished request's blocks: vLLM's `KVCacheManager.free`."""
        self.manager.free(request)

    def _record(
        self,
        step: int,
        op: str,
        request_id: str | None,
        hit_tokens: int | None,
        block_ids: tuple[int, ...] | None,
        evicted: tuple[int, ...],
        held: bool | None,
    ) -> StepRecord:
        queue = tuple(b.block_id for b in self.pool.free_block_queue.get_all_free_blocks())
        if len(queue) != self.pool.get_num_free_blocks():
            raise DriverError(f"step {step}: free queue length and free block count disagree")
        return StepRecord(
            stream=self.config.name,
            step=step,
            op=op,
            request_id=request_id,
            hit_tokens=hit_tokens,
            block_ids=block_ids,
            evicted=evicted,
            held=held,
            free_queue=queue,
            cached=tuple(b.block_id for b in self.pool.blocks if b.block_hash is not None),
        )


def load_vllm(allow_other_version: bool) -> Any:
    """Import the vLLM pieces the replay needs and initialise its block hashing (sha256)."""
    import types

    import torch
    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request, RequestStatus

    if vllm.__version__ != EXPECTED_VLLM_VERSION and not allow_other_version:
        raise DriverError(
            f"vLLM {vllm.__version__} is installed; this driver is pinned to "
            f"{EXPECTED_VLLM_VERSION} (internal APIs move between releases). "
            "Pass --allow-other-version to try anyway."
        )
    init_none_hash(sha256)
    return types.SimpleNamespace(
        version=vllm.__version__,
        torch=torch,
        SamplingParams=SamplingParams,
        hash_fn=sha256,
        KVCacheManager=KVCacheManager,
        get_request_block_hasher=get_request_block_hasher,
        FullAttentionSpec=FullAttentionSpec,
        KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec,
        Request=Request,
        RequestStatus=RequestStatus,
    )


def _parse(source: IO[str]) -> Iterator[Stream]:
    """Streams from JSON lines; malformed input becomes a DriverError (vLLM's own errors don't)."""
    try:
        yield from read_streams(source)
    except ValueError as exc:
        raise DriverError(f"bad input: {exc}") from None


def replay_all(vllm: Any, streams: Iterable[Stream], out: IO[str]) -> dict[str, Any]:
    """Replay every stream, writing its records as they come; returns counts and timings."""
    count = 0
    seconds: dict[str, float] = {}
    for stream in streams:
        start = time.perf_counter()
        for record in VllmReplay(vllm, stream.config).run(stream.ops):
            out.write(record.to_json() + "\n")
            count += 1
        seconds[stream.config.name] = round(time.perf_counter() - start, 4)
    return {"records": count, "seconds_per_stream": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, help="JSON-lines stream (default: stdin)")
    parser.add_argument("--output", type=Path, help="where to write the records (default: stdout)")
    parser.add_argument(
        "--allow-other-version",
        action="store_true",
        help=f"run even if the installed vLLM is not {EXPECTED_VLLM_VERSION}",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="only import what the replay needs and report the vLLM version",
    )
    args = parser.parse_args(argv)
    try:
        start = time.perf_counter()
        vllm = load_vllm(args.allow_other_version)
        import_seconds = round(time.perf_counter() - start, 2)
        if args.check:
            print(f"vLLM {vllm.version}: the replay's imports work")
            return 0
        source = args.input.open(encoding="utf-8") if args.input else sys.stdin
        sink = args.output.open("w", encoding="utf-8") if args.output else sys.stdout
        with source, sink:
            summary = replay_all(vllm, _parse(source), sink)
    except (DriverError, ImportError) as exc:
        print(f"vllm_replay: error: {exc}", file=sys.stderr)
        return 2
    # The last line on stderr: a summary the differential test reads.
    summary = {"vllm_version": vllm.version, "import_seconds": import_seconds, **summary}
    print(json.dumps(summary), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
