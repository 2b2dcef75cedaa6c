"""The vLLM plugin's side of the request log: a finished vLLM request → a `FinishedRequest`.

Runs on the scheduler thread inside the release the plugin already wraps, so it only reads
attributes and queues a record (`RequestLogWriter.append`); hashing, JSON and disk happen on
the writer's thread. The writer starts with the first finished request, i.e. in the engine
core process (vLLM loads plugins in every process; only the engine core frees KV blocks), with
the block pool's hash block size. Nothing here raises into vLLM: a failure is counted
(`record_errors`) and logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lpc.integrations.config import PluginConfig
from lpc.integrations.request_hints import RequestHints
from lpc.integrations.request_log import FinishedRequest, RequestLogConfig, RequestLogWriter

logger = logging.getLogger("vllm.plugins.lpc")

REQUEST_TYPE_KEY = "lpc_request_type"  # an optional `extra_args` field: text, search, ...
_DEFAULT_HASH_BLOCK_SIZE = 16


class PluginRequestLog:
    """Finished requests of one engine core, queued for its `RequestLogWriter`."""

    def __init__(self, config: PluginConfig, clock: Callable[[], float]) -> None:
        assert config.request_log_dir is not None
        self._config = config
        self._clock = clock
        self._writer: RequestLogWriter | None = None
        self._block_size: int | None = None
        # request id -> (prefix-cache hit, lookup order) of its first prefill's lookup
        self._lookups: dict[str, tuple[int, int]] = {}
        self._lookup_count = 0
        self._record_errors = 0

    def note_computed(self, request: Any, num_computed_tokens: Any, pool: Any) -> None:
        """`get_computed_blocks`' hit for the request (vLLM's prefill statistics count the
        first prefill, not a preempted request's recomputation; so do we)."""
        if self._block_size is None:
            size = getattr(pool, "hash_block_size", None)
            self._block_size = size if isinstance(size, int) and size > 0 else None
        if getattr(request, "num_preemptions", 0) > 0 or not isinstance(num_computed_tokens, int):
            return
        self._lookup_count += 1
        self._lookups[request.request_id] = (num_computed_tokens, self._lookup_count)

    def finished(
        self, request: Any, hints: RequestHints, probability: float | None, source: str
    ) -> None:
        """Queue the request's record if it finished (a preempted request comes back)."""
        try:
            is_finished = getattr(request, "is_finished", None)
            if is_finished is not None and not is_finished():
                return
            rid = request.request_id
            params = request.sampling_params
            extra = params.extra_args if params is not None else None
            request_type = extra.get(REQUEST_TYPE_KEY) if isinstance(extra, dict) else None
            turn_count = hints.turn_count
            cached_tokens, order = self._lookups.pop(rid, (0, None))
            # Positional: keyword arguments would triple the cost of this line (≈ 2 µs).
            record = FinishedRequest(
                rid,
                request.arrival_time,
                self._clock(),
                request.num_prompt_tokens,
                cached_tokens,
                request.num_output_tokens,
                # vLLM appends to this list only while the request runs: safe to read later.
                request.block_hashes,
                hints.conversation_id,
                turn_count - 1 if turn_count else None,
                probability,
                source,
                request_type if isinstance(request_type, str) else None,
                hints.user_prompts or None,
                order,
            )
            self._start().append(record)
        except Exception as error:
            self._record_errors += 1
            if self._record_errors == 1:
                logger.warning("request log: cannot record a finished request: %r", error)

    def _start(self) -> RequestLogWriter:
        writer = self._writer
        if writer is None:
            config = self._config
            assert config.request_log_dir is not None
            writer = self._writer = RequestLogWriter(
                RequestLogConfig(
                    Path(config.request_log_dir),
                    block_size=self._block_size or _DEFAULT_HASH_BLOCK_SIZE,
                    max_file_bytes=int(config.request_log_max_file_mb * 1024 * 1024),
                    record_text=config.request_log_text,
                    salt=config.request_log_salt,
                    queue_size=config.request_log_queue_size,
                    retention_days=config.request_log_retention_days,
                )
            )
        return writer

    def counters(self) -> dict[str, int]:
        out = self._writer.counters.snapshot() if self._writer is not None else {}
        return {
            "records_written": out.get("records_written", 0),
            "records_dropped": out.get("records_dropped", 0) + self._record_errors,
            "bytes_written": out.get("bytes_written", 0),
            "record_errors": self._record_errors,
            "queued": self._writer.queued if self._writer is not None else 0,
        }

    def summary(self) -> str:
        c = self.counters()
        return (
            f"LPC request log: {c['records_written']} records written "
            f"({c['bytes_written']} bytes), {c['records_dropped']} dropped"
        )

    def flush(self, timeout_s: float = 5.0) -> bool:
        return self._writer.flush(timeout_s) if self._writer is not None else True

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
