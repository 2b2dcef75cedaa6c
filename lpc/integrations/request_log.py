"""The serving stack's own request log: one `lpc` trace line per finished request.

`RequestLogWriter.append`, called on the scheduler thread, only puts the record on a bounded
queue and never blocks or raises; a background thread writes daily files, rotates and prunes
them, and drops and counts records when anything goes wrong. Prompts are logged as keyed
hashes of the engine's block hashes, never as text unless `record_text` is on.

Files, privacy and failures: docs/design.md, "The request log"; the format: docs/traces.md,
"Request logs".
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger("vllm.plugins.lpc")

LOG_SOURCE = "request-log"  # the header's `source`: tells the reader to label by horizon
KEY_FILE_NAME = ".lpc-log-key"
FILE_PATTERN = re.compile(r"^requests-(\d{4}-\d{2}-\d{2})-pid(\d+)-(\d+)\.jsonl$")
PROBABILITY_SOURCES = ("client", "model", "fallback")
DEFAULT_MAX_FILE_BYTES = 256 * 1024 * 1024
DEFAULT_QUEUE_SIZE = 65536
# A month: longer than the daily job's windows (it reads the last days' files), short
# enough that a busy engine's log stays a bounded share of its disk.
DEFAULT_RETENTION_DAYS = 30
_MAX_BATCH = 1024
_ID_MASK = (1 << 63) - 1  # ids stay within a signed 64-bit int for every JSON reader


@dataclass(slots=True)
class FinishedRequest:
    """What the engine knows about a request when it releases its blocks.

    Not frozen: it is built on the scheduler's release path, and a frozen dataclass's
    `__init__` costs several times more; nothing changes a record once queued.

    `block_hashes` are the engine's chained hashes of the sequence's full blocks (prompt,
    then output), bytes or ints; they are turned into keyed ids on the writer thread.
    Times are seconds since the epoch (`time.time()`), as vLLM stamps arrivals.
    """

    request_id: str
    arrival_s: float
    finish_s: float
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    block_hashes: Sequence[bytes | int]
    conversation_id: str | None = None
    turn_index: int | None = None
    probability: float | None = None
    probability_source: str | None = None  # client, model or fallback
    request_type: str | None = None
    user_prompts: tuple[str, ...] | None = None  # written only with record_text
    # The order this process looked requests up in its prefix cache: a replay breaks ties
    # of equal arrival times by it (clocks with coarse ticks, or traces with ms timestamps).
    arrival_order: int | None = None


@dataclass(frozen=True)
class RequestLogConfig:
    """Where and how the log is written; validated by the plugin configuration."""

    directory: Path
    block_size: int = 16  # the engine's block size: one hash id per this many tokens
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    record_text: bool = False
    salt: str | None = None  # the deployment key; None: a random key kept in the folder
    queue_size: int = DEFAULT_QUEUE_SIZE
    warn_interval_s: float = 60.0
    # Files of days more than this many UTC days before the newest are deleted (0: kept).
    retention_days: int = DEFAULT_RETENTION_DAYS


class LogFile(Protocol):
    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...


class _AppendFile:
    """An O_APPEND file descriptor written with whole `os.write` calls (no buffering)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def close(self) -> None:
        os.close(self._fd)


def open_append(path: Path) -> LogFile:
    return _AppendFile(path)


def deployment_key(directory: Path, salt: str | None) -> bytes:
    """The key of the block-id hash: the salt, or the folder's shared random key."""
    if salt is not None:
        return hashlib.blake2b(salt.encode(), digest_size=32, person=b"lpc-log-salt").digest()
    path = directory / KEY_FILE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):  # another process may be writing it right now
            text = path.read_text(encoding="ascii").strip()
            if len(text) == 64:
                return bytes.fromhex(text)
            time.sleep(0.01)
        raise OSError(errno.EINVAL, f"{path}: not a 64-hex-digit key") from None
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(key.hex() + "\n")
    return key


def key_fingerprint(key: bytes) -> str:
    """Names the key in file headers without revealing it (logs with different keys share no
    block ids, so a reader can tell them apart)."""
    return hashlib.blake2b(key, digest_size=8, person=b"lpc-log-fp").hexdigest()


class BlockIds:
    """Engine block hashes → keyed 63-bit ids, memoised (a conversation's turns repeat their
    prefix's hashes; the memo is cleared when it reaches `memo_size` entries)."""

    def __init__(self, key: bytes, memo_size: int = 1 << 20) -> None:
        self._key = key
        self._memo: dict[bytes | int, int] = {}
        self._memo_size = memo_size

    def _keyed(self, data: bytes) -> int:
        digest = hashlib.blake2b(data, digest_size=8, key=self._key).digest()
        return int.from_bytes(digest, "little") & _ID_MASK

    def of(self, block_hash: bytes | int) -> int:
        found = self._memo.get(block_hash)
        if found is None:
            # An int hash (any size) by its decimal digits, prefixed apart from bytes hashes.
            data = block_hash if isinstance(block_hash, bytes) else b"int:%d" % block_hash
            found = self._keyed(data)
            if len(self._memo) >= self._memo_size:
                self._memo.clear()
            self._memo[block_hash] = found
        return found

    def sequence(self, record: FinishedRequest, block_size: int, nonce: bytes) -> list[int]:
        """One id per `block_size` tokens of prompt + output (the last may be partial).

        Blocks the engine did not hash (the partial last one, or any it had not hashed yet)
        get ids unique to this request (`nonce`): the engine cannot have shared them.
        """
        total = record.num_prompt_tokens + record.num_output_tokens
        needed = -(-total // block_size)
        ids = [self.of(h) for h in record.block_hashes[:needed]]
        for index in range(len(ids), needed):
            ids.append(self._keyed(b"unshared:" + nonce + index.to_bytes(4, "little")))
        return ids


@dataclass
class RequestLogCounters:
    """Totals since the writer started; `records_dropped` sums the three `dropped_*`."""

    records_written: int = 0
    records_dropped: int = 0
    dropped_queue_full: int = 0
    dropped_write_errors: int = 0
    dropped_invalid_id: int = 0  # an id held a lone surrogate: no line can keep it apart
    bytes_written: int = 0
    files_opened: int = 0
    files_expired: int = 0  # deleted: of a day older than the retention
    finish_before_arrival: int = 0  # the clock went backwards during a request: clamped
    invalid_unicode: int = 0  # a recorded prompt held a lone surrogate: U+FFFD in its place
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in vars(self).items() if not k.startswith("_")}


# A str holds a valid surrogate pair as one code point, so any surrogate left is a lone half.
_SURROGATE = re.compile("[\ud800-\udfff]")


def utc_day(time_s: float) -> str:
    return dt.datetime.fromtimestamp(time_s, dt.UTC).strftime("%Y-%m-%d")


class RequestLogWriter:
    """Appends finished requests to the log folder from a background thread.

    `append` is the only method the serving path calls: a length check and an append to a
    bounded deque. `close` writes what is queued (up to `timeout_s`) and stops the thread.
    """

    def __init__(
        self,
        config: RequestLogConfig,
        *,
        pid: int | None = None,
        open_file: Callable[[Path], LogFile] = open_append,
        monotonic: Callable[[], float] = time.monotonic,
        poll_interval_s: float = 0.005,
    ) -> None:
        self.config = config
        self.counters = RequestLogCounters()
        self._pid = os.getpid() if pid is None else pid
        self._open_file = open_file
        self._monotonic = monotonic
        self._poll_interval_s = poll_interval_s
        # A deque, not a queue.Queue: `append` and `popleft` are atomic under the GIL and
        # take no lock, so the serving thread pays ~0.1 µs; the writer polls when idle.
        self._pending: deque[FinishedRequest] = deque()
        self._busy = False  # the writer holds records it took but has not written yet
        self._stopping = False
        self._file: LogFile | None = None
        self._file_bytes = 0
        self._day = ""  # the UTC day of the open file; never moves backwards
        self._ids: BlockIds | None = None
        self._fingerprint = ""
        self._serial = 0
        self._next_warning_s = -float("inf")
        self._thread = threading.Thread(target=self._run, name="lpc-request-log", daemon=True)
        self._thread.start()

    # -- the serving side ----------------------------------------------------------------
    def append(self, record: FinishedRequest) -> bool:
        """Queue one record; False (counted, never raised) when it had to be dropped."""
        pending = self._pending
        if len(pending) >= self.config.queue_size or self._stopping:
            self.counters.add(records_dropped=1, dropped_queue_full=1)
            self._warn("request log queue full (%d records): dropping records", len(pending))
            return False
        pending.append(record)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (up to `timeout_s`), then stop the thread."""
        self._stopping = True
        self._thread.join(timeout_s)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every record queued so far is written or dropped (tests, shutdown)."""
        deadline = self._monotonic() + timeout_s
        while self._pending or self._busy:
            if self._monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.001)
        return True

    @property
    def queued(self) -> int:
        return len(self._pending)

    # -- the writer thread ---------------------------------------------------------------
    def _warn(self, message: str, *args: Any) -> None:
        now = self._monotonic()
        if now >= self._next_warning_s:
            self._next_warning_s = now + self.config.warn_interval_s
            logger.warning(message + " (counted in records_dropped)", *args)

    def _run(self) -> None:
        pending = self._pending
        while True:
            if not pending:
                if self._stopping:
                    break
                time.sleep(self._poll_interval_s)
                continue
            self._busy = True
            batch = [pending.popleft() for _ in range(min(len(pending), _MAX_BATCH))]
            try:
                self._write_batch(batch)
            except Exception as error:
                self.counters.add(records_dropped=len(batch), dropped_write_errors=len(batch))
                self._warn("request log: cannot write to %s: %s", self.config.directory, error)
                self._close_file()
            self._busy = False
        self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def _write_batch(self, batch: list[FinishedRequest]) -> None:
        if self._ids is None:
            self.config.directory.mkdir(parents=True, exist_ok=True)
            key = deployment_key(self.config.directory, self.config.salt)
            self._ids = BlockIds(key)
            self._fingerprint = key_fingerprint(key)
        # One day per batch: the newest record's day (a day boundary inside a batch puts a
        # few records in the next day's file; the reader merges files by time anyway).
        day = max(self._day, utc_day(max(r.finish_s for r in batch)))
        lines = [self._line(record) for record in batch]
        try:
            data = "".join(lines).encode("utf-8")
            kept = len(batch)
        except UnicodeEncodeError:
            data, kept = self._encode_replacing(batch, lines)
        if not kept:
            return
        if (
            self._file is None
            or day != self._day
            or self._file_bytes + len(data) > self.config.max_file_bytes
        ):
            if day != self._day:
                self._expire(day)
            self._open(day)
        assert self._file is not None
        self._file.write(data)
        self._file_bytes += len(data)
        self.counters.add(records_written=kept, bytes_written=len(data))

    def _expire(self, day: str) -> None:
        """Delete the folder's log files of days more than `retention_days` before `day`
        (a failure is counted as a warning, never a lost record)."""
        keep_days = self.config.retention_days
        if keep_days <= 0:
            return
        first_kept = (dt.date.fromisoformat(day) - dt.timedelta(days=keep_days)).isoformat()
        try:
            for path in self.config.directory.iterdir():
                match = FILE_PATTERN.match(path.name)
                if match and match.group(1) < first_kept:
                    path.unlink(missing_ok=True)
                    self.counters.add(files_expired=1)
        except OSError as error:
            self._warn(
                "request log: cannot delete expired files in %s: %s", self.config.directory, error
            )

    def _open(self, day: str) -> None:
        """A new file for `day` (after the newest of this process's files of that day)."""
        self._close_file()
        directory = self.config.directory
        prefix = f"requests-{day}-pid{self._pid}-"
        taken = [
            int(m.group(3))
            for p in directory.iterdir()
            if p.name.startswith(prefix) and (m := FILE_PATTERN.match(p.name))
        ]
        path = directory / f"{prefix}{max(taken, default=-1) + 1:03d}.jsonl"
        header = {
            "format": "lpc-trace",
            "version": 1,
            "source": LOG_SOURCE,
            "hash_block_size": self.config.block_size,
            "key_fingerprint": self._fingerprint,
            "pid": self._pid,
            "day_utc": day,
            "text_recorded": self.config.record_text,
        }
        data = (json.dumps(header) + "\n").encode("utf-8")
        handle = self._open_file(path)
        try:
            handle.write(data)
        except BaseException:
            handle.close()
            raise
        self._file, self._day, self._file_bytes = handle, day, len(data)
        self.counters.add(files_opened=1, bytes_written=len(data))

    def _line(self, record: FinishedRequest) -> str:
        assert self._ids is not None
        self._serial += 1
        nonce_text = f"{self._fingerprint}:{self._pid}:{self._serial}:{record.request_id}"
        nonce = nonce_text.encode("utf-8", "surrogatepass")
        finish_s = record.finish_s
        if finish_s < record.arrival_s:
            finish_s = record.arrival_s
            self.counters.add(finish_before_arrival=1)
        out: dict[str, Any] = {"request_id": record.request_id}
        if record.conversation_id is not None:
            out["conversation_id"] = record.conversation_id
        if record.turn_index is not None:
            out["turn_index"] = record.turn_index
        out["arrival_s"] = record.arrival_s
        if record.arrival_order is not None:
            out["arrival_order"] = record.arrival_order
        out["completion_s"] = finish_s
        out["input_length"] = record.num_prompt_tokens
        out["output_length"] = record.num_output_tokens
        out["cached_tokens"] = record.num_cached_tokens
        out["probability"] = record.probability
        if record.probability_source is not None:
            out["probability_source"] = record.probability_source
        if record.request_type is not None:
            out["request_type"] = record.request_type
        out["sequence_hash_ids"] = self._ids.sequence(record, self.config.block_size, nonce)
        if self.config.record_text and record.user_prompts:
            out["user_prompts"] = list(record.user_prompts)
        return json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n"

    def _encode_replacing(
        self, batch: list[FinishedRequest], lines: list[str]
    ) -> tuple[bytes, int]:
        """A batch holding a lone surrogate (half a UTF-16 pair), which UTF-8 cannot encode
        and a reader refuses, as bytes and the number of records kept.

        In a recorded prompt it becomes U+FFFD (text, repaired as the loaders repair
        messages; counted). In an id it cannot: `dup\\ud800` and `dup\\udbff` would both
        become `dup\\ufffd` and merge two conversations (three, with a real `dup\\ufffd`), and
        an escape would be refused by every trace reader. Such a record is dropped and counted
        (`dropped_invalid_id`); the rest of the batch is written as it is.
        """
        parts = []
        for record, line in zip(batch, lines, strict=True):
            try:
                parts.append(line.encode("utf-8"))
                continue
            except UnicodeEncodeError:
                pass
            ids = (record.request_id, record.conversation_id, record.request_type)
            if any(value is not None and _SURROGATE.search(value) for value in ids):
                self.counters.add(records_dropped=1, dropped_invalid_id=1)
                self._warn(
                    "request log: an id holds a lone surrogate (half a UTF-16 pair), which "
                    "no log line can hold without merging it with another id: dropping its record"
                )
                continue
            self.counters.add(invalid_unicode=1)
            parts.append(_SURROGATE.sub("\ufffd", line).encode("utf-8"))
        return b"".join(parts), len(parts)
