"""A string that is not Unicode text (a lone surrogate, JSON's `\\ud800` escape without its
pair) is refused when a trace is read, naming the file, line and field, in every format: no
export, request log, table or report could write it out later."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpc.cli.main import main
from lpc.errors import InvalidInputError
from lpc.traces.jsonl import TraceError
from lpc.traces.load import TraceOptions, load_trace
from lpc.traces.lpc_trace import read_trace, write_trace
from tests.lpc.traces.helpers import mooncake_record

LONE = "\\ud800"  # as JSON text: the escape of half a UTF-16 pair


def token_line(conversation: str = "b", arrival_s: float = 10.0, **extra: str) -> str:
    """A request line as JSON text; `conversation` and the `extra` values are written as
    they are (JSON escapes included)."""
    fields = [
        f'"conversation_id": "{conversation}"',
        f'"arrival_s": {arrival_s}, "completion_s": {arrival_s + 1}',
        '"prompt_token_ids": [1, 2, 3], "output_token_ids": [5]',
        *(f'"{key}": {value}' for key, value in extra.items()),
    ]
    return "{" + ", ".join(fields) + "}"


def bailian_line(chat_id: str) -> str:
    return (
        f'{{"chat_id": {chat_id}, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 10, '
        '"output_length": 1, "type": "text", "turn": 1, "hash_ids": [7]}'
    )


REQUEST_LOG_HEADER = '{"format": "lpc-trace", "version": 1, "hash_block_size": 16}'
REQUEST_LOG_LINE = (
    '{"arrival_s": 1.0, "completion_s": 2.0, "input_length": 10, "output_length": 1, '
    f'"sequence_hash_ids": [4], "request_id": "r{LONE}"}}'
)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            [token_line(), token_line(f"{LONE}x", 0.0)],
            r"t\.jsonl:2: 'conversation_id' is not valid Unicode: a lone surrogate \\ud800 "
            "at character 0",
        ),
        (
            [token_line(), token_line(user_prompts=f'["ok", "a{LONE}"]')],
            r"t\.jsonl:2: 'user_prompts\[1\]' is not valid Unicode: .* at character 1",
        ),
        (
            [token_line(cache_salt='"\\udfff"')],
            r"t\.jsonl:1: 'cache_salt' is not valid Unicode: a lone surrogate \\udfff",
        ),
        (
            [token_line(extra=f'{{"note": [1, "{LONE}"]}}')],
            r"t\.jsonl:1: 'extra\.note\[1\]' is not valid Unicode",
        ),
        ([token_line(**{f"k{LONE}": "1"})], r"t\.jsonl:1: 'key' is not valid Unicode"),
        (
            [REQUEST_LOG_HEADER, REQUEST_LOG_LINE],
            r"t\.jsonl:2: 'request_id' is not valid Unicode",
        ),
        (
            [
                json.dumps(mooncake_record(0, [1])),
                json.dumps(mooncake_record(1, [1]))[:-1] + f', "source": "{LONE}"}}',
            ],
            r"t\.jsonl:2: 'source' is not valid Unicode",
        ),
        ([bailian_line(f'"c{LONE}"')], r"t\.jsonl:1: 'chat_id' is not valid Unicode"),
    ],
    ids=[
        "conversation-id",
        "user-prompts",
        "cache-salt",
        "nested",
        "key",
        "request-log",
        "mooncake",
        "bailian",
    ],
)
def test_a_lone_surrogate_is_refused_naming_file_line_and_field(
    tmp_path: Path, lines: list[str], message: str
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=message):
        load_trace(path, TraceOptions())


def test_surrogates_written_as_bytes_are_refused_too(tmp_path: Path) -> None:
    # UTF-8-like bytes of U+D800, which `json.loads` passes through rather than refusing.
    path = tmp_path / "t.jsonl"
    path.write_bytes(
        token_line("PLACE", 0.0).replace("PLACE", "\udcff").encode("utf-8", "surrogatepass") + b"\n"
    )
    with pytest.raises(TraceError, match=r"t\.jsonl:1: 'conversation_id' is not valid Unicode"):
        read_trace(path)


def test_a_chat_line_s_messages_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    line = {"conversation_id": "a", "arrival_s": 0, "completion_s": 1}
    text = json.dumps(line)[:-1] + f', "messages": [{{"role": "user", "content": "hi {LONE}"}}]}}'
    path.write_text(text + "\n")
    with pytest.raises(TraceError, match=r"'messages\[0\]\.content' is not valid Unicode"):
        read_trace(path, lambda messages, reply: ([1], []))


def test_escaped_pairs_and_other_text_are_read_and_written_back(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(token_line("\\ud83d\\ude00 caf\\u00e9", 0.0) + "\n" + token_line() + "\n")
    trace = read_trace(path)
    assert trace.requests[0].conversation_id == "\U0001f600 café"
    out = tmp_path / "out.jsonl"
    write_trace(out, trace.requests, {})
    assert read_trace(out).requests[0].conversation_id == "\U0001f600 café"


def test_lpc_ab_with_export_trace_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(token_line(f"{LONE}x", 0.0) + "\n" + token_line() + "\n")
    args = ["ab", "--no-progress", "--trace", str(path), "--policies", "lru"]
    args += ["--cache-sizes", "60000", "--out", str(tmp_path / "out")]
    args += ["--export-trace", str(tmp_path / "exp.jsonl")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s.jsonl:1: 'conversation_id' is not valid Unicode" in err[0]
    assert not (tmp_path / "exp.jsonl").exists()


def test_lpc_retrain_on_trace_logs_names_the_file_and_line(tmp_path: Path, capsys) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / "trace-2025-06-01.jsonl"
    path.write_text(token_line(f"{LONE}x", 0.0) + "\n" + token_line() + "\n")
    code = main(["retrain", "--logs", str(logs), "--registry", str(tmp_path / "registry")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"lpc retrain: error: {path}:1: 'conversation_id' is not valid Unicode: a lone "
        "surrogate \\ud800 at character 0 (half of a UTF-16 pair)"
    ]


def test_write_trace_refuses_a_request_that_is_not_unicode_in_one_line(tmp_path: Path) -> None:
    """Requests from a conversation data set (whose loaders keep ids as they are) may hold a
    lone surrogate; the export names it instead of failing half-way with a traceback."""
    trace = read_trace(_written(tmp_path / "t.jsonl", [token_line("a", 0.0), token_line()]))
    trace.requests[1].turn.user_prompts = ("fine", "bad \ud800")
    out = tmp_path / "out.jsonl"
    with pytest.raises(InvalidInputError) as raised:
        write_trace(out, trace.requests, {})
    assert str(raised.value) == (
        f"{out}: cannot write line 3: 'user_prompts[1]' is not valid Unicode: a lone surrogate "
        "\\ud800 at character 4 (half of a UTF-16 pair)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]  # no half-written file


def _written(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path
