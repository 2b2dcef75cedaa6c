"""Request traces as JSON lines: the format `lpc ab --trace` replays and `--export-trace` writes.

One request per line, an optional first line a header (`{"format": "lpc-trace", ...}`); a
request carries its conversation, arrival and completion times and its prompt in one of the
token, chat-message or block-hash forms (`hash_ids`, or a request log's `sequence_hash_ids`).
Real serving logs are the intended input (`lpc.integrations.request_log` writes them: a folder
of files, read here merged by time); generated workloads export the same format. Files may be
gzip-compressed; a cut last line (a log still being written) is skipped and counted.

Every field: docs/traces.md, "The `lpc` format".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from lpc.errors import InvalidInputError
from lpc.traces import fields
from lpc.traces.expand import SyntheticTokens, expand_requests
from lpc.traces.jsonl import TraceError, fail, not_unicode, read_json_lines
from lpc.traces.linkage import DEFAULT_SHARED_FANOUT, link_by_prefix
from lpc.workload import ScriptedTurn, WorkloadRequest, compact_tokens
from predictor.atomic_files import atomic_open

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
    cut_files: tuple[Path, ...] = ()  # the files whose cut last line was skipped


def _token_list(record: dict, key: str, path: Path, lineno: int) -> list[int]:
    value = record.get(key)
    if not isinstance(value, list):
        raise fail(path, lineno, f"{key!r} must be a list of token ids")
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise fail(path, lineno, f"{key}[{i}] must be an int >= 0, got {token!r}")
    return value


def _optional_str(record: dict, key: str, path: Path, lineno: int) -> str | None:
    value = record.get(key)
    if value is not None and not isinstance(value, str):
        raise fail(path, lineno, f"{key!r} must be a string or null, got {value!r}")
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


# Stage 1: the files' lines and the header.


@dataclass(frozen=True)
class _Gathered:
    """Every request line of the trace with its file and line number, before any check."""

    rows: list[tuple[Path, int, dict]]
    header: dict[str, Any]
    cut_files: list[Path]  # whose cut last line was skipped (a file has one last line)


def _gather(path: Path) -> _Gathered:
    """Every request line of a file, or of every file of a folder (a request log: one file
    per process and day), with its file and line; the header; cut last lines skipped.

    Each file of a folder may start with a header (every process writes its own); the first
    one is the trace's, and the others must agree on the block size, since one block size
    expands every line of the merged trace, and on the key, since ids hashed with another
    key never match. A header anywhere but a file's first line is refused: it is the mark of
    logs joined with `cat`, whose second file's order and key this reader cannot tell."""
    files = trace_files(path) if path.is_dir() else [path]
    rows: list[tuple[Path, int, dict]] = []
    header: dict[str, Any] = {}
    header_file: Path | None = None
    cut_files: list[Path] = []
    headerless: list[tuple[Path, int]] = []  # files (and first line) that start without one
    for file in files:
        lines = read_json_lines(file)
        if lines.skipped_last_lines:
            cut_files.append(file)
        if lines.records and lines.records[0][1].get("format") != TRACE_FORMAT:
            headerless.append((file, lines.records[0][0]))
        for index, (lineno, record) in enumerate(lines.records):
            if record.get("format") == TRACE_FORMAT:
                if index > 0:
                    raise _joined_logs(file, lineno, lines.records[0])
                _check_header(file, lineno, record, header, header_file)
                if header_file is None:
                    header, header_file = dict(record), file
                continue
            rows.append((file, lineno, record))
    if headerless and header.get("key_fingerprint") is not None:
        file, lineno = headerless[0]
        raise fail(
            file,
            lineno,
            f"no header, while {header_file}'s names 'key_fingerprint' "
            f"{header['key_fingerprint']!r}: the key of this file's ids cannot be checked (a "
            "request log starts with its header; was it cut or joined by hand?)",
        )
    if len(files) > 1:
        header["files"] = len(files)
    return _Gathered(rows, header, cut_files)


def _joined_logs(file: Path, lineno: int, first: tuple[int, dict]) -> TraceError:
    """The error for a header after a file's first line (logs joined with `cat`)."""
    first_lineno, first_record = first
    where = (
        f"the first is line {first_lineno}"
        if first_record.get("format") == TRACE_FORMAT
        else f"after request lines from line {first_lineno}"
    )
    return fail(
        file,
        lineno,
        f"a second header ({where}): were logs joined with cat? pass the files "
        "separately (one folder holding each file as written, given as the trace or --logs)",
    )


def _check_header(
    file: Path, lineno: int, record: dict, first: dict[str, Any], first_file: Path | None
) -> None:
    """A header this reader understands, agreeing with the folder's first header."""
    if record.get("version") != TRACE_VERSION:
        raise fail(file, lineno, f"unsupported trace version {record.get('version')!r}")
    if first_file is not None and record.get("hash_block_size") != first.get("hash_block_size"):
        raise fail(
            file,
            lineno,
            f"'hash_block_size' {record.get('hash_block_size')!r} differs from "
            f"{first.get('hash_block_size')!r} in {first_file}",
        )
    if first_file is not None and record.get("key_fingerprint") != first.get("key_fingerprint"):
        raise fail(
            file,
            lineno,
            f"'key_fingerprint' {record.get('key_fingerprint')!r} differs from "
            f"{first.get('key_fingerprint')!r} in {first_file}: logs hashed with different "
            "keys share no block ids, so their common prefixes would vanish; replay each "
            "key's logs as a trace of its own",
        )


def _hash_block_size(path: Path, header: dict[str, Any]) -> int | None:
    """The header's block size (the block-hash forms need one), or None (token ids)."""
    size = header.get("hash_block_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise TraceError(f"{path}: header 'hash_block_size' must be an int >= 1, got {size!r}")
    return size


# Stage 2: one line's tokens, by its form.
#
# A request log has millions of lines, so what a line keeps is one slotted `_Line`: the
# stages return named tuples, unpacked into it. Several objects per line would cost more to
# build (frozen dataclasses five times as much) and, kept alive until the end, far more in
# garbage collection.


class _HashForm(NamedTuple):
    """A block-hash line's ids and lengths; expanded to tokens once every line is read, since
    the expansion numbers the distinct blocks of the whole trace."""

    ids: list[int]
    num_prompt: int
    num_output: int
    covers_output: bool  # `sequence_hash_ids`: the ids cover the output tokens too


class _Tokens(NamedTuple):
    """What a line's form gives: its token ids, or its block ids (`hash_form`, with a
    one-token placeholder prompt until expansion); chat `messages` when it had them (they
    supply the default user prompts)."""

    prompt: list[int]
    output: list[int]
    hash_form: _HashForm | None = None
    messages: list[dict[str, str]] | None = None


def _hash_key(record: dict) -> str:
    """The block-hash field a line would use: a request log's, else an imported trace's."""
    return "sequence_hash_ids" if "sequence_hash_ids" in record else "hash_ids"


def _line_tokens(
    record: dict,
    path: Path,
    lineno: int,
    block_size: int | None,
    tokenize: MessageTokenizer | None,
) -> _Tokens:
    """The line's tokens from whichever form it is in. A trace with a block size is in the
    block-hash form throughout: its lines cannot be mixed with token ids, whose blocks
    would never match the expanded ones."""
    hash_key = _hash_key(record)
    if hash_key in record:
        return _hash_tokens(record, path, lineno, block_size, hash_key)
    if block_size is not None:
        raise fail(
            path,
            lineno,
            "a trace with 'hash_block_size' needs 'hash_ids' or 'sequence_hash_ids' on every line",
        )
    if "prompt_token_ids" in record:
        prompt = _token_list(record, "prompt_token_ids", path, lineno)
        output = (
            _token_list(record, "output_token_ids", path, lineno)
            if "output_token_ids" in record
            else []
        )
        return _Tokens(prompt, output)
    if "messages" in record:
        return _chat_tokens(record, path, lineno, tokenize)
    raise fail(path, lineno, "needs 'prompt_token_ids' (token form) or 'messages' (chat form)")


def _hash_tokens(
    record: dict, path: Path, lineno: int, block_size: int | None, hash_key: str
) -> _Tokens:
    """A block-hash line: one id per block of the prompt (`hash_ids`, imported traces) or
    of prompt and output (`sequence_hash_ids`, request logs), checked against the lengths."""
    if block_size is None:
        raise fail(path, lineno, f"{hash_key!r} needs 'hash_block_size' in the header line")
    num_prompt = fields.count(record, "input_length", path, lineno, minimum=1)
    num_output = fields.count(record, "output_length", path, lineno)
    covers_output = hash_key == "sequence_hash_ids"
    ids = fields.hash_ids(
        record,
        path,
        lineno,
        num_prompt + (num_output if covers_output else 0),
        block_size,
        key=hash_key,
        length_name="'input_length' + 'output_length'" if covers_output else "'input_length'",
    )
    return _Tokens([0], [], _HashForm(ids, num_prompt, num_output, covers_output))


def _chat_tokens(
    record: dict, path: Path, lineno: int, tokenize: MessageTokenizer | None
) -> _Tokens:
    """A chat line: the messages and reply text, tokenised by the caller's tokenizer (the
    trace does not say which model's)."""
    messages = record["messages"]
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise fail(path, lineno, "'messages' must be a list of {role, content} strings")
    reply = record.get("output", "")
    if not isinstance(reply, str):
        raise fail(path, lineno, "'output' must be the reply text")
    if tokenize is None:
        raise fail(path, lineno, "chat messages need a tokenizer to replay")
    prompt, output = tokenize(messages, reply)
    return _Tokens(prompt, output, None, messages)


# Stage 3: the line's other fields.


class _TurnFields(NamedTuple):
    """What a line may say about its turn; None where the assembly derives it."""

    turn_index: int | None
    has_next: bool | None
    user_prompts: list[str] | None


class _LoggedFields(NamedTuple):
    """The optional fields a serving log records about a request."""

    probability: float | None
    lora_id: str | int | None
    request_id: str | None
    cached_tokens: int | None
    arrival_order: int
    cache_salt: str | None


@dataclass(slots=True)
class _Line:
    """One request line, checked, before the trace is sorted and its conversations linked:
    where it is, its identity and times, then `_Tokens`, `_TurnFields` and `_LoggedFields`
    (less the chat messages, which only supply the default user prompts)."""

    file: Path
    lineno: int
    conversation_id: str | None  # None: inferred by prefix linkage (block-hash forms)
    arrival: float
    completion: float
    prompt: list[int]
    output: list[int]
    hash_form: _HashForm | None
    turn_index: int | None
    has_next: bool | None
    user_prompts: list[str] | None
    probability: float | None
    lora_id: str | int | None
    request_id: str | None
    cached_tokens: int | None
    arrival_order: int
    cache_salt: str | None

    @property
    def num_prompt_tokens(self) -> int:
        return self.hash_form.num_prompt if self.hash_form else len(self.prompt)

    def sort_key(self) -> tuple[float, str, int, int]:
        """Arrival order: by time, then within one file by `arrival_order` and line."""
        return (self.arrival, str(self.file), self.arrival_order, self.lineno)


def _parse_line(
    path: Path,
    lineno: int,
    record: dict,
    block_size: int | None,
    tokenize: MessageTokenizer | None,
) -> _Line:
    """Check one request line. Fields are checked in a fixed order (identity, times,
    tokens, then the optional ones), so the first problem of a line is always the one
    reported."""
    conversation_id = record.get("conversation_id")
    if conversation_id is None and _hash_key(record) in record:
        pass  # inferred by prefix linkage (a request log without client ids)
    elif not isinstance(conversation_id, str) or not conversation_id:
        raise fail(
            path, lineno, f"'conversation_id' must be a non-empty string, got {conversation_id!r}"
        )
    arrival = fields.time_value(record, "arrival_s", path, lineno)
    completion = fields.time_value(record, "completion_s", path, lineno)
    if completion < arrival:
        raise fail(path, lineno, f"completion_s {completion} is before arrival_s {arrival}")
    tokens = _line_tokens(record, path, lineno, block_size, tokenize)
    if not tokens.prompt:
        raise fail(path, lineno, "the prompt is empty")
    turn = _turn_fields(record, path, lineno, tokens.messages)
    num_prompt = tokens.hash_form.num_prompt if tokens.hash_form else len(tokens.prompt)
    logged = _logged_fields(record, path, lineno, num_prompt)
    kept = (tokens.prompt, tokens.output, tokens.hash_form)  # the messages are done with
    return _Line(path, lineno, conversation_id, arrival, completion, *kept, *turn, *logged)


def _turn_fields(
    record: dict, path: Path, lineno: int, messages: list[dict[str, str]] | None
) -> _TurnFields:
    """Turn index, next-turn label and user prompts, where the line gives them; a chat
    line's user prompts default to its user messages."""
    turn_index = record.get("turn_index")
    if turn_index is not None and (
        isinstance(turn_index, bool) or not isinstance(turn_index, int) or turn_index < 0
    ):
        raise fail(path, lineno, f"'turn_index' must be an int >= 0, got {turn_index!r}")
    has_next = record.get("has_next_turn")
    if has_next is not None and not isinstance(has_next, bool):
        raise fail(path, lineno, f"'has_next_turn' must be true, false or null, got {has_next!r}")
    prompts = record.get("user_prompts")
    if prompts is None and messages is not None:
        prompts = [m["content"] for m in messages if m["role"] == "user"]
    if prompts is not None and not (
        isinstance(prompts, list) and all(isinstance(p, str) for p in prompts)
    ):
        raise fail(path, lineno, "'user_prompts' must be a list of strings")
    return _TurnFields(turn_index, has_next, prompts)


def _logged_fields(record: dict, path: Path, lineno: int, num_prompt: int) -> _LoggedFields:
    """The optional fields of a request log; `cached_tokens` cannot exceed the prompt."""
    probability = record.get("probability")
    if probability is not None and (
        isinstance(probability, bool)
        or not isinstance(probability, int | float)
        or not 0.0 <= probability <= 1.0
    ):
        raise fail(path, lineno, f"'probability' must be in [0, 1] or null, got {probability!r}")
    lora = record.get("lora_id")
    if lora is not None and (isinstance(lora, bool) or not isinstance(lora, str | int)):
        raise fail(path, lineno, f"'lora_id' must be a string, int or null, got {lora!r}")
    request_id = _optional_str(record, "request_id", path, lineno)
    cached = record.get("cached_tokens")
    if cached is not None and (
        isinstance(cached, bool) or not isinstance(cached, int) or not 0 <= cached <= num_prompt
    ):
        raise fail(
            path, lineno, f"'cached_tokens' must be an int in [0, prompt tokens], got {cached!r}"
        )
    for key in ("probability_source", "request_type"):
        _optional_str(record, key, path, lineno)
    order = record.get("arrival_order", 0)
    if isinstance(order, bool) or not isinstance(order, int):
        raise fail(path, lineno, f"'arrival_order' must be an int, got {order!r}")
    salt = _optional_str(record, "cache_salt", path, lineno)
    return _LoggedFields(probability, lora, request_id, cached, order, salt)


# Stage 4: the checked lines, in arrival order, as requests.


@dataclass(frozen=True)
class _Linked:
    """Per line (in arrival order): its conversation (given or inferred by prefix linkage),
    the turn linkage inferred (None when given), and the block-hash form's tokens."""

    conversations: list[str]
    linked_turns: list[int | None]
    expanded: list[SyntheticTokens]


def _link(lines: list[_Line], block_size: int | None) -> _Linked:
    """Expand the block-hash form and infer the conversations its lines leave out; both
    need every line at once (block ids are numbered, and prefixes linked, trace-wide)."""
    expanded: list[SyntheticTokens] = []
    inferred: dict[int, tuple[str, int]] = {}
    if block_size is not None:
        forms = [line.hash_form for line in lines]
        expanded = expand_requests(
            [f.ids for f in forms],
            [f.num_prompt for f in forms],
            [f.num_output for f in forms],
            block_size,
            [f.covers_output for f in forms],
        )
        inferred = _inferred_conversations(lines, block_size)
    conversations = [
        line.conversation_id if line.conversation_id is not None else inferred[i][0]
        for i, line in enumerate(lines)
    ]
    turns = [inferred[i][1] if i in inferred else None for i in range(len(lines))]
    return _Linked(conversations, turns, expanded)


def _inferred_conversations(lines: list[_Line], block_size: int) -> dict[int, tuple[str, int]]:
    """Conversation id and turn of each hash-form line without a `conversation_id`, by
    prefix linkage over the prompts' block ids (docs/traces.md, "Prefix linkage (Mooncake)")."""
    rows = [i for i, line in enumerate(lines) if line.conversation_id is None]
    if not rows:
        return {}
    forms = [lines[i].hash_form for i in rows]
    prompts = [f.ids[: -(-f.num_prompt // block_size)] for f in forms]
    linkage = link_by_prefix(prompts, DEFAULT_SHARED_FANOUT)
    return {
        row: (f"linked-{rows[linkage.conversation[k]]}", linkage.turn_index[k])
        for k, row in enumerate(rows)
    }


def _requests(lines: list[_Line], block_size: int | None) -> list[WorkloadRequest]:
    """The lines (in arrival order) as requests. A turn index or next-turn label the line
    leaves out is derived from the conversation's other lines: turns count up in arrival
    order, and a turn has a next one when its conversation arrives again later."""
    linked = _link(lines, block_size)
    last_arrival: dict[str, float] = {}
    for conv, line in zip(linked.conversations, lines, strict=True):
        last_arrival[conv] = line.arrival
    seen_turns: dict[str, int] = {}
    seen_ids: set[str] = set()
    requests: list[WorkloadRequest] = []
    for i, line in enumerate(lines):
        conv = linked.conversations[i]
        turn_index = line.turn_index
        if turn_index is None:
            turn_index = linked.linked_turns[i]
        index = seen_turns.get(conv, 0) if turn_index is None else turn_index
        seen_turns[conv] = index + 1
        has_next = line.has_next
        if has_next is None:
            has_next = last_arrival[conv] > line.arrival
        rid = line.request_id or f"{conv}#{index}"
        if rid in seen_ids:
            raise fail(line.file, line.lineno, f"request id {rid!r} appears twice")
        seen_ids.add(rid)
        expanded = linked.expanded[i] if line.hash_form else None
        turn = _scripted_turn(line, conv, index, has_next, expanded)
        requests.append(WorkloadRequest(rid, turn, line.arrival, line.completion))
    return requests


def _scripted_turn(
    line: _Line, conv: str, index: int, has_next: bool, expanded: SyntheticTokens | None
) -> ScriptedTurn:
    """The turn a replay sees: token ids (the block-hash form's expanded ones, else the
    line's, stored compactly) and the fields predictors and block hashes use."""
    return ScriptedTurn(
        conv,
        index,
        expanded if expanded is not None else compact_tokens([*line.prompt, *line.output]),
        line.num_prompt_tokens,
        has_next,
        tuple(line.user_prompts or ()),
        line.cache_salt,
        line.lora_id,
    )


def read_trace(path: str | Path, tokenize: MessageTokenizer | None = None) -> Trace:
    """Parse and validate a trace file, or a folder of them (merged by time); the first
    problem raises `TraceError` with its file and line.

    Stages: gather the lines and the header (`_gather`), check each line on its own
    (`_parse_line`), then sort them by arrival and build the requests (`_requests`), which
    needs the whole trace (linked conversations, derived turns and labels)."""
    path = Path(path)
    gathered = _gather(path)
    if not gathered.rows:
        raise TraceError(f"{path}: the trace holds no requests")
    block_size = _hash_block_size(path, gathered.header)
    lines = [
        _parse_line(file, lineno, record, block_size, tokenize)
        for file, lineno, record in gathered.rows
    ]
    lines.sort(key=_Line.sort_key)
    requests = _requests(lines, block_size)
    probabilities = [line.probability for line in lines]
    cached = [line.cached_tokens for line in lines]
    return Trace(
        requests,
        gathered.header,
        probabilities if any(p is not None for p in probabilities) else None,
        block_size,
        len(gathered.cut_files),
        cached if any(c is not None for c in cached) else None,
        tuple(gathered.cut_files),
    )


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
    with atomic_open(path, "w") as handle:  # a failure (OutputWriteError) leaves no file
        for index, line in enumerate(trace_lines(requests, header, probabilities)):
            try:
                handle.write(line + "\n")
            except UnicodeEncodeError:
                raise _not_writable(path, index, line) from None


def _not_writable(path: Path, index: int, line: str) -> InvalidInputError:
    """A line holding a lone surrogate, which no UTF-8 file can: the requests came from
    input that held one (a data set's id; a trace file's is refused when read)."""
    what = "the header" if index == 0 else f"line {index + 1}"
    problem = not_unicode(json.loads(line)) or "not valid Unicode"
    return InvalidInputError(f"{path}: cannot write {what}: {problem}")
