"""Request traces as JSON lines: the format `lpc ab --trace` replays and `--export-trace` writes.

One request per line (an optional first line is a header, `{"format": "lpc-trace", ...}`):

    conversation_id   str, required
    arrival_s         number >= 0, required
    completion_s      number >= arrival_s, required
    prompt_token_ids  [int >= 0], and output_token_ids [int >= 0]      } one of three
    messages          [{"role", "content"}] ending with the user turn, } forms; messages are
    output            the assistant's reply text                       } tokenised on reading
    hash_ids          [int >= 0] one per block of the header's `hash_block_size` prompt
                      tokens, with input_length and output_length (the block-hash form of
                      imported production traces; expanded by `lpc.traces.expand`)
    sequence_hash_ids the same over prompt and output tokens (a request log's form)
    conversation_id   may be left out in the block-hash forms: inferred by prefix linkage
    cached_tokens     int, optional: the engine's prefix-cache hit (a request log)
    arrival_order     int, optional: breaks ties of equal arrival_s within a file
    probability_source, request_type   str, optional (a request log)
    request_id        str, optional (default "<conversation_id>#<turn_index>")
    turn_index        int >= 0, optional (default: order of arrival within the conversation)
    has_next_turn     bool, optional (default: a later request of the conversation exists)
    user_prompts      [str], optional: the recent user prompts, current last (for predictors)
    cache_salt        str or null, optional;  lora_id  str, int or null, optional
    probability       number in [0, 1] or null, optional: a prediction logged by the server

Real serving logs are the intended input (`lpc.integrations.request_log` writes them: a
folder of files, read here merged by time); generated workloads export the same format, so
any trace can be replayed by anyone with the same numbers. Files may be gzip-compressed; a cut
last line (a log still being written) is skipped and counted.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lpc.traces import fields
from lpc.traces.expand import SyntheticTokens, expand_requests
from lpc.traces.jsonl import TraceError, read_json_lines
from lpc.traces.linkage import DEFAULT_SHARED_FANOUT, link_by_prefix
from lpc.workload import ScriptedTurn, WorkloadRequest, compact_tokens

TRACE_FORMAT = "lpc-trace"
TRACE_VERSION = 1

# (messages, output text) -> (prompt token ids, output token ids)
MessageTokenizer = Callable[[list[dict[str, str]], str], tuple[list[int], list[int]]]


__all__ = ["Trace", "TraceError", "read_trace", "trace_lines", "write_trace"]


@dataclass(frozen=True)
class Trace:
    requests: list[WorkloadRequest]
    header: dict[str, Any]
    logged_probabilities: list[float | None] | None  # None when no line carries one
    hash_block_size: int | None = None  # the block-hash form's block size; None: token ids
    skipped_last_lines: int = 0  # cut last lines, skipped (one per file at most)
    # The engine's cached prompt tokens per request, as a request log records them
    logged_cached_tokens: list[int | None] | None = None


def _fail(path: Path, lineno: int, message: str) -> TraceError:
    return TraceError(f"{path}:{lineno}: {message}")


def _number(record: dict, key: str, path: Path, lineno: int) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(path, lineno, f"{key!r} must be a finite number, got {value!r}")
    if value < 0:
        raise _fail(path, lineno, f"{key!r} must be >= 0, got {value!r}")
    return float(value)


def _token_list(record: dict, key: str, path: Path, lineno: int) -> list[int]:
    value = record.get(key)
    if not isinstance(value, list):
        raise _fail(path, lineno, f"{key!r} must be a list of token ids")
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise _fail(path, lineno, f"{key}[{i}] must be an int >= 0, got {token!r}")
    return value


def _optional_str(record: dict, key: str, path: Path, lineno: int) -> str | None:
    value = record.get(key)
    if value is not None and not isinstance(value, str):
        raise _fail(path, lineno, f"{key!r} must be a string or null, got {value!r}")
    return value


def trace_files(path: Path) -> list[Path]:
    """A folder's trace files (`*.jsonl`, `*.jsonl.gz`; hidden files skipped), by name."""
    files = sorted(
        p
        for p in path.iterdir()
        if p.is_file()
        and not p.name.startswith(".")
        and (p.name.endswith(".jsonl") or p.name.endswith(".jsonl.gz"))
    )
    if not files:
        raise TraceError(f"{path}: the folder holds no .jsonl or .jsonl.gz trace files")
    return files


def _gather(path: Path) -> tuple[list[tuple[Path, int, dict]], dict[str, Any], int]:
    """Every request line of a file, or of every file of a folder (a request log: one file
    per process and day), with its file and line; the header; cut last lines skipped."""
    files = trace_files(path) if path.is_dir() else [path]
    rows: list[tuple[Path, int, dict]] = []
    header: dict[str, Any] = {}
    header_file: Path | None = None
    skipped = 0
    for file in files:
        lines = read_json_lines(file)
        skipped += lines.skipped_last_lines
        for index, (lineno, record) in enumerate(lines.records):
            if index == 0 and record.get("format") == TRACE_FORMAT:
                if record.get("version") != TRACE_VERSION:
                    raise _fail(
                        file, lineno, f"unsupported trace version {record.get('version')!r}"
                    )
                if header_file is not None and record.get("hash_block_size") != header.get(
                    "hash_block_size"
                ):
                    raise _fail(
                        file,
                        lineno,
                        f"'hash_block_size' {record.get('hash_block_size')!r} differs from "
                        f"{header.get('hash_block_size')!r} in {header_file}",
                    )
                if header_file is None:
                    header, header_file = dict(record), file
                continue
            rows.append((file, lineno, record))
    if len(files) > 1:
        header["files"] = len(files)
    return rows, header, skipped


def read_trace(path: str | Path, tokenize: MessageTokenizer | None = None) -> Trace:
    """Parse and validate a trace file, or a folder of them (merged by time); the first
    problem raises `TraceError` with its file and line."""
    path = Path(path)
    rows, header, skipped_last_lines = _gather(path)
    if not rows:
        raise TraceError(f"{path}: the trace holds no requests")
    hash_block_size = header.get("hash_block_size")
    if hash_block_size is not None and (
        isinstance(hash_block_size, bool)
        or not isinstance(hash_block_size, int)
        or hash_block_size < 1
    ):
        raise TraceError(
            f"{path}: header 'hash_block_size' must be an int >= 1, got {hash_block_size!r}"
        )

    parsed = []
    for path, lineno, record in rows:
        conversation_id = record.get("conversation_id")
        hash_key = "sequence_hash_ids" if "sequence_hash_ids" in record else "hash_ids"
        if conversation_id is None and hash_key in record:
            pass  # inferred by prefix linkage below (a request log without client ids)
        elif not isinstance(conversation_id, str) or not conversation_id:
            raise _fail(
                path,
                lineno,
                f"'conversation_id' must be a non-empty string, got {conversation_id!r}",
            )
        arrival = _number(record, "arrival_s", path, lineno)
        completion = _number(record, "completion_s", path, lineno)
        if completion < arrival:
            raise _fail(path, lineno, f"completion_s {completion} is before arrival_s {arrival}")
        hash_form = None
        if hash_key in record:
            if hash_block_size is None:
                raise _fail(
                    path, lineno, f"{hash_key!r} needs 'hash_block_size' in the header line"
                )
            num_prompt = fields.count(record, "input_length", path, lineno, minimum=1)
            num_output = fields.count(record, "output_length", path, lineno)
            covers_output = hash_key == "sequence_hash_ids"
            ids = fields.hash_ids(
                record,
                path,
                lineno,
                num_prompt + (num_output if covers_output else 0),
                hash_block_size,
                key=hash_key,
                length_name=(
                    "'input_length' + 'output_length'" if covers_output else "'input_length'"
                ),
            )
            hash_form = (ids, num_prompt, num_output, covers_output)
            prompt, output, messages = [0], [], None
        elif hash_block_size is not None:
            raise _fail(
                path,
                lineno,
                "a trace with 'hash_block_size' needs 'hash_ids' or 'sequence_hash_ids' on "
                "every line",
            )
        elif "prompt_token_ids" in record:
            prompt = _token_list(record, "prompt_token_ids", path, lineno)
            output = (
                _token_list(record, "output_token_ids", path, lineno)
                if "output_token_ids" in record
                else []
            )
            messages = None
        elif "messages" in record:
            messages = record["messages"]
            if not isinstance(messages, list) or not all(
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
                for m in messages
            ):
                raise _fail(path, lineno, "'messages' must be a list of {role, content} strings")
            reply = record.get("output", "")
            if not isinstance(reply, str):
                raise _fail(path, lineno, "'output' must be the reply text")
            if tokenize is None:
                raise _fail(path, lineno, "chat messages need a tokenizer to replay")
            prompt, output = tokenize(messages, reply)
        else:
            raise _fail(
                path, lineno, "needs 'prompt_token_ids' (token form) or 'messages' (chat form)"
            )
        if not prompt:
            raise _fail(path, lineno, "the prompt is empty")
        turn_index = record.get("turn_index")
        if turn_index is not None and (
            isinstance(turn_index, bool) or not isinstance(turn_index, int) or turn_index < 0
        ):
            raise _fail(path, lineno, f"'turn_index' must be an int >= 0, got {turn_index!r}")
        has_next = record.get("has_next_turn")
        if has_next is not None and not isinstance(has_next, bool):
            raise _fail(
                path, lineno, f"'has_next_turn' must be true, false or null, got {has_next!r}"
            )
        prompts = record.get("user_prompts")
        if prompts is None and messages is not None:
            prompts = [m["content"] for m in messages if m["role"] == "user"]
        if prompts is not None and not (
            isinstance(prompts, list) and all(isinstance(p, str) for p in prompts)
        ):
            raise _fail(path, lineno, "'user_prompts' must be a list of strings")
        probability = record.get("probability")
        if probability is not None and (
            isinstance(probability, bool)
            or not isinstance(probability, int | float)
            or not 0.0 <= probability <= 1.0
        ):
            raise _fail(
                path, lineno, f"'probability' must be in [0, 1] or null, got {probability!r}"
            )
        lora = record.get("lora_id")
        if lora is not None and (isinstance(lora, bool) or not isinstance(lora, str | int)):
            raise _fail(path, lineno, f"'lora_id' must be a string, int or null, got {lora!r}")
        request_id = _optional_str(record, "request_id", path, lineno)
        cached_tokens = record.get("cached_tokens")
        if cached_tokens is not None and (
            isinstance(cached_tokens, bool)
            or not isinstance(cached_tokens, int)
            or not 0 <= cached_tokens <= (hash_form[1] if hash_form else len(prompt))
        ):
            raise _fail(
                path,
                lineno,
                f"'cached_tokens' must be an int in [0, prompt tokens], got {cached_tokens!r}",
            )
        for key in ("probability_source", "request_type"):
            _optional_str(record, key, path, lineno)
        arrival_order = record.get("arrival_order", 0)
        if isinstance(arrival_order, bool) or not isinstance(arrival_order, int):
            raise _fail(path, lineno, f"'arrival_order' must be an int, got {arrival_order!r}")
        parsed.append(
            (
                arrival,
                lineno,
                conversation_id,
                completion,
                prompt,
                output,
                turn_index,
                has_next,
                prompts,
                _optional_str(record, "cache_salt", path, lineno),
                lora,
                probability,
                request_id,
                hash_form,
                cached_tokens,
                str(path),
                arrival_order,
            )
        )

    parsed.sort(key=lambda row: (row[0], row[15], row[16], row[1]))
    expanded: list[SyntheticTokens] = []
    inferred: dict[int, tuple[str, int]] = {}
    if hash_block_size is not None:
        forms = [row[13] for row in parsed]
        expanded = expand_requests(
            [f[0] for f in forms],
            [f[1] for f in forms],
            [f[2] for f in forms],
            hash_block_size,
            [f[3] for f in forms],
        )
        inferred = _inferred_conversations(parsed, hash_block_size)
    last_arrival: dict[str, float] = {}
    for row_index, row in enumerate(parsed):
        last_arrival[row[2] if row[2] is not None else inferred[row_index][0]] = row[0]
    seen_turns: dict[str, int] = {}
    seen_ids: set[str] = set()
    requests: list[WorkloadRequest] = []
    logged: list[float | None] = []
    for (
        arrival,
        lineno,
        conv,
        completion,
        prompt,
        output,
        turn_index,
        has_next,
        prompts,
        salt,
        lora,
        probability,
        request_id,
        hash_form,
        _cached,
        _file,
        _order,
    ) in parsed:
        if conv is None:
            conv, linked_turn = inferred[len(requests)]
            turn_index = linked_turn if turn_index is None else turn_index
        index = seen_turns.get(conv, 0) if turn_index is None else turn_index
        seen_turns[conv] = index + 1
        if has_next is None:
            has_next = last_arrival[conv] > arrival
        rid = request_id or f"{conv}#{index}"
        if rid in seen_ids:
            raise _fail(path, lineno, f"request id {rid!r} appears twice")
        seen_ids.add(rid)
        tokens = expanded[len(requests)] if hash_form else compact_tokens([*prompt, *output])
        turn = ScriptedTurn(
            conv,
            index,
            tokens,
            hash_form[1] if hash_form else len(prompt),
            has_next,
            tuple(prompts or ()),
            salt,
            lora,
        )
        requests.append(WorkloadRequest(rid, turn, arrival, completion))
        logged.append(probability)
    has_logged = any(p is not None for p in logged)
    cached = [row[14] for row in parsed]
    return Trace(
        requests,
        header,
        logged if has_logged else None,
        hash_block_size,
        skipped_last_lines,
        cached if any(c is not None for c in cached) else None,
    )


def _inferred_conversations(parsed: list[tuple], block_size: int) -> dict[int, tuple[str, int]]:
    """Conversation id and turn of each hash-form line without a `conversation_id`, by
    prefix linkage over the prompts' block ids (docs/traces.md, "Prefix linkage (Mooncake)")."""
    rows = [i for i, row in enumerate(parsed) if row[2] is None]
    if not rows:
        return {}
    prompts = [parsed[i][13][0][: -(-parsed[i][13][1] // block_size)] for i in rows]
    linkage = link_by_prefix(prompts, DEFAULT_SHARED_FANOUT)
    return {
        row: (f"linked-{rows[linkage.conversation[k]]}", linkage.turn_index[k])
        for k, row in enumerate(rows)
    }


def trace_lines(
    requests: Iterable[WorkloadRequest],
    header: dict[str, Any],
    probabilities: Sequence[float | None] | None = None,
) -> Iterable[str]:
    requests = list(requests)
    block_sizes = {
        r.turn.token_ids.trace_block_size
        for r in requests
        if isinstance(r.turn.token_ids, SyntheticTokens)
    }
    if len(block_sizes) > 1 or (
        block_sizes
        and len(requests) != sum(isinstance(r.turn.token_ids, SyntheticTokens) for r in requests)
    ):
        raise ValueError("a trace is written in one form: all token ids or all hash ids")
    head = {"format": TRACE_FORMAT, "version": TRACE_VERSION, **header}
    if block_sizes:
        head["hash_block_size"] = block_sizes.pop()
    yield json.dumps(head)
    for i, request in enumerate(requests):
        turn = request.turn
        record: dict[str, Any] = {
            "request_id": request.request_id,
            "conversation_id": turn.conversation_id,
            "turn_index": turn.turn_index,
            "arrival_s": request.arrival_s,
            "completion_s": request.completion_s,
            "has_next_turn": turn.has_next_turn,
        }
        tokens = turn.token_ids
        if isinstance(tokens, SyntheticTokens):
            record["input_length"] = tokens.num_prompt_tokens
            record["output_length"] = tokens.num_output_tokens
            key = "sequence_hash_ids" if tokens.covers_output else "hash_ids"
            record[key] = tokens.block_ids.tolist()
        else:
            record["prompt_token_ids"] = list(tokens[: turn.num_prompt_tokens])
            record["output_token_ids"] = list(tokens[turn.num_prompt_tokens :])
        if turn.user_prompts:
            record["user_prompts"] = list(turn.user_prompts)
        if turn.cache_salt is not None:
            record["cache_salt"] = turn.cache_salt
        if turn.lora_id is not None:
            record["lora_id"] = turn.lora_id
        if probabilities is not None:
            record["probability"] = probabilities[i]
        yield json.dumps(record, ensure_ascii=False)


def write_trace(
    path: str | Path,
    requests: Sequence[WorkloadRequest],
    header: dict[str, Any],
    probabilities: Sequence[float | None] | None = None,
) -> None:
    """Write atomically (temp file + rename): a crash never leaves half a trace behind.

    `probabilities`, one per request, are written as each line's `probability` (a source's
    predictions, so that engines replaying the trace can use the same ones).
    """
    if probabilities is not None and len(probabilities) != len(requests):
        raise ValueError(f"{len(probabilities)} probabilities for {len(requests)} requests")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            for line in trace_lines(requests, header, probabilities):
                handle.write(line + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
